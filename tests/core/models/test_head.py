"""The likelihood's output head is the model's own (cdscope.core.models.head, SPEC §2).

cdscope runs the decoder stack and then the LM head at the scored positions itself; a
wrapper that transforms the logits after its head (Cohere's ``logit_scale``, Granite's
``logits_scaling``, Falcon-H1's ``lm_head_multiplier``, HyperCLOVA X's multiplier) was
measured with the wrong likelihood (row log-likelihoods off by up to 15.6 nats here); so
were MiniCPM3, ModernBERT-decoder, RecurrentGemma and Inkling, found by the proof's check.
The slow twin here is the model's own forward and a log-softmax of all its logits."""

from __future__ import annotations

import pytest
import torch

from cdscope.core.likelihood import row_target_logprobs
from cdscope.core.models.architecture import architecture_of
from cdscope.tools import tiny

#: (model type, config changes, whether cdscope's own head reproduces the model's logits)
CASES = [
    ("llama", {}, True),
    ("gemma2", {"final_logit_softcapping": 3.0}, True),  # soft-capping: applied by cdscope
    ("cohere", {"logit_scale": 0.0625}, False),
    ("cohere2_moe", {"logit_scale": 0.0625}, False),
    ("granite", {"logits_scaling": 4.0}, False),
    ("falcon_h1", {"lm_head_multiplier": 0.5}, False),
    ("hyperclovax", {"logits_scaling": 2.0}, False),
    ("minicpm3", {}, False),  # hidden states scaled before the head
    ("modernbert-decoder", {}, False),  # a dense + norm prediction head before the decoder
    ("recurrent_gemma", {}, False),  # soft-capping under its own name, logits_soft_cap
]


def _model(model_type: str, changes: dict):  # noqa: ANN202
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = tiny.tiny_config(model_type)
    for key, value in changes.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", experts_implementation="eager"
    )
    return model.to(torch.float64).eval()


@pytest.mark.parametrize(("model_type", "changes", "own"), CASES, ids=[c[0] for c in CASES])
def test_row_loglikelihood_is_the_models_own(model_type: str, changes: dict, own: bool) -> None:
    model = _model(model_type, changes)
    batch = tiny.random_batch()
    rows = torch.arange(4)
    assert architecture_of(model).proof.own_head is own
    with torch.no_grad():
        ours = row_target_logprobs(model, batch, rows)
        width = int(batch.lengths.max())
        logits = model(input_ids=batch.input_ids[:, :width], use_cache=False).logits
        local, pos, labels = batch.predicting_positions(rows)
        logp = torch.log_softmax(logits[local, pos].double(), -1).gather(1, labels[:, None])
        slow = torch.zeros(4, dtype=torch.float64).index_add(0, local, logp[:, 0])
    # float64: floor 3.6e-15 nats (cohere; 0 for the others) at 1 and 2 threads; 280x
    # margin. With cdscope's own head forced on every type (the bug): 2.3e-4 (recurrent_gemma)
    # to 15.6 nats (minicpm3)
    torch.testing.assert_close(ours, slow, rtol=0, atol=1e-12)


def test_inspect_says_where_the_logits_come_from(tmp_path) -> None:
    """``cdscope inspect`` names the model's own forward where cdscope's head is not it."""
    from tests.helpers import invoke

    for model_type, changes, own in (CASES[0], CASES[2]):
        directory = tiny.save_checkpoint(_model(model_type, changes), tmp_path / model_type)
        result = invoke("inspect", "-m", directory, "--json")
        assert result.exit_code == 0, result.output
        assert f'"own_head": {str(own).lower()}' in result.output
        text = invoke("inspect", "-m", directory).output
        assert ("logits: through the model's own forward" in text) is (not own)
