"""RWKV (issue 31): the stream starts after block 0's embedding norm ``pre_ln``
(``cdscope.core.models.stream_start``) and the inference rescaling is turned off
(``cdscope.core.models.rescaling``); proven, C against finite differences, and the edge
graph's consistency, on a tiny RWKV saved with ``save_pretrained`` and loaded by path.

The tiny config halves the stream after every block in eval mode (``rescale_every = 1``,
``tiny.TWEAKS``), so every load below goes through the unscaling."""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest
import torch

from cdscope.core.eap import edge_scores
from cdscope.core.models import diagnosis, rescaling, stream_start
from cdscope.core.models import discovery as d
from cdscope.core.models.architecture import architecture_of
from cdscope.core.models.loading import load_model
from cdscope.errors import CdscopeError
from cdscope.tools import coverage, tiny
from tests.helpers import gate_gradient, invoke, write_pool

PRE_LN = "rwkv.blocks.0.pre_ln"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny.save_checkpoint(tiny.tiny_model("rwkv"), tmp_path_factory.mktemp("rwkv"))


def _load(checkpoint, dtype: str) -> torch.nn.Module:
    return load_model(str(checkpoint), device="cpu", dtype=dtype).model


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_the_stream_starts_after_pre_ln_and_is_proven(checkpoint, dtype: str) -> None:
    model = _load(checkpoint, dtype)
    assert model.config.rescale_every == 1
    arch = architecture_of(model)
    assert model.config.rescale_every == 0  # turned off before the discovery
    assert arch.stream_start == PRE_LN and arch.source == "discovered"
    assert [(w.layer, w.role, w.pre_norm.rsplit(".", 1)[-1]) for w in arch.writes] == [
        (0, "mixer", "ln1"), (0, "mlp", "ln2"), (1, "mixer", "ln1"), (1, "mlp", "ln2"),
    ]  # fmt: skip
    proof = arch.proof
    assert proof.unit_gates_exact and proof.zero_gates_error == 0.0
    assert proof.write_sum_error <= proof.write_sum_tolerance


def test_block_zero_is_a_sum_of_writes_only_from_the_norms_output(checkpoint) -> None:
    """Block 0's own update h_out - h_in is still no sum of writes (the diagnosis names
    pre_ln); from pre_ln's output it is. On Llama, whose first module is also a norm of
    the block input, restarting there fits nothing: the rule cannot fire on a pre-norm."""
    model = _load(checkpoint, "float64")
    path, blocks = d.find_blocks(model)
    trace = d.trace_forward(model, blocks, d.probe_ids(model, torch.device("cpu"))).blocks[0]
    with pytest.raises(d.NotAdditive):
        d.solve_block(trace, torch.float64, None)
    reason = diagnosis.through_norm(trace, model, f"{path}.0.", torch.float64)
    assert "passes through the norm pre_ln inside the block" in reason
    _, found, norm = stream_start.solve_after_norm(trace, model, torch.float64)
    assert norm == PRE_LN and found.scales == (1.0, 1.0)
    llama = tiny.tiny_model("llama")
    path, blocks = d.find_blocks(llama)
    trace = d.trace_forward(llama, blocks, d.probe_ids(llama, torch.device("cpu"))).blocks[0]
    assert stream_start.embedding_norm(trace, llama).name == f"{path}.0.input_layernorm"
    assert stream_start.solve_after_norm(trace, llama, torch.float64) is None


def test_the_halving_between_blocks_is_refused_when_left_on(checkpoint, monkeypatch) -> None:
    """Why the rescaling is turned off: left on, the proof's zero-gate check sees it."""
    monkeypatch.setattr(rescaling, "unscaled", lambda model: False)
    with pytest.raises(CdscopeError, match="something else writes to the residual stream"):
        architecture_of(_load(checkpoint, "float64"))


def _rescaled_pair(eps: float, layers: int = 4, every: int = 2):
    torch.manual_seed(0)
    config = tiny.tiny_config("rwkv")
    config.num_hidden_layers, config.rescale_every, config.layer_norm_epsilon = layers, every, eps
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    model.rwkv.ln_out.eps = eps
    weights = copy.deepcopy(model.state_dict())
    ids = torch.randint(3, tiny.VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        rescaled = model(input_ids=ids, use_cache=False).logits  # divides the weights
        assert rescaling.unscaled(model)
        plain = model(input_ids=ids, use_cache=False).logits
        model.train()
        trained = model(input_ids=ids, use_cache=False).logits
    restored = all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    return rescaled, plain, trained, restored


def test_the_rescaled_form_differs_from_the_plain_one_by_layernorm_eps_alone() -> None:
    """The twin of the unscaling: weights divided by an eval forward come back bit for bit
    (powers of two), eval and training then compute one function, and with every
    LayerNorm eps at 0 the rescaled inference form gives the very same logits; with eps
    1e-5 it does not (measured max |dlogit| 1.0e-4 here, at 1 and 2 threads: the halved stream's
    variance meets the same eps)."""
    rescaled, plain, trained, restored = _rescaled_pair(eps=0.0)
    assert restored and torch.equal(plain, trained)
    assert torch.equal(rescaled, plain)
    rescaled, plain, _, _ = _rescaled_pair(eps=1e-5)
    assert (rescaled - plain).abs().max() > 1e-6


def test_a_model_already_rescaled_by_an_eval_forward_is_measured_unscaled(checkpoint) -> None:
    model = _load(checkpoint, "float64")
    weights = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=False)
    assert model.rwkv.layers_are_rescaled
    assert not torch.equal(model.rwkv.blocks[1].attention.output.weight, weights[
        "rwkv.blocks.1.attention.output.weight"])  # fmt: skip
    architecture_of(model)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_control_matches_central_finite_differences(checkpoint) -> None:
    """C by autograd against central differences, float64 throughout (coverage's twin)."""
    error = coverage.fd_agreement(_load(checkpoint, "float64"))
    assert error <= 1e-9  # floor 3.1e-11 (1 thread), 4.1e-11 (2 threads) measured; 24x margin


def test_edge_sums_equal_minus_the_gate_gradient_with_h0_after_pre_ln(checkpoint) -> None:
    """EAP's consistency twin, the h_0 scalar on pre_ln's output; a mixer reads the stream
    through one path (ln1), so E = sum_l [(2l+1) + (2l+2)] + 2L + 1 = 15 for L = 2."""
    model, batch = _load(checkpoint, "float64"), tiny.random_batch()
    result = edge_scores(model, batch)
    assert result.graph.E == 15
    expected = gate_gradient(model, batch, model.get_submodule(PRE_LN))
    # each upstream node's outgoing edges: a row of the [upstream, consumer] matrix
    summed = np.stack([np.nansum(result.graph.matrix(row), axis=1) for row in result.scores])
    scale = np.abs(expected).max()
    assert scale > 1e-3
    # floor 2.3e-15 (1 thread), 1.8e-15 (2 threads) of the scale measured; 430x margin
    np.testing.assert_allclose(summed, expected, rtol=0, atol=1e-12 * scale)


def test_inspect_and_probe_on_the_checkpoint(checkpoint, tmp_path) -> None:
    """The user's path: inspect names where the stream starts and the mixers' one EAP
    path; probe measures C over the four gates."""
    result = invoke("inspect", "--model", checkpoint, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["stream_start"] == PRE_LN and record["eap_info"] == "yes"
    writes = [w for layer in record["layers"] for w in layer["writes"]]
    assert [(w["role"], w["eap_paths"]) for w in writes] == [
        ("mixer", ["in"]), ("mlp", ["in"]), ("mixer", ["in"]), ("mlp", ["in"]),
    ]  # fmt: skip
    pool = write_pool(tmp_path / "pool.jsonl", {"math": 3, "code": 3})
    out = tmp_path / "probe.parquet"
    result = invoke("probe", "--model", checkpoint, "--probe", pool, "--n", 2, "--out", out)
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out)
    C = frame.pivot(index="family", columns="gate", values="C").to_numpy()  # noqa: N806
    assert C.shape == (2, 4) and np.isfinite(C).all() and np.abs(C).max() > 0


def test_generation_of_prompts_of_several_lengths_matches_each_prompt_alone(checkpoint) -> None:
    """RWKV's forward ignores the attention mask: a left-padded row's recurrent state reads
    its pads (measured: the padded row's last logits move by 3.1), so prompts of unequal
    lengths are never generated in one call (``generation.pads_change_logits``)."""
    from cdscope.core.generation import _spans, pads_change_logits, sample

    loaded = load_model(str(checkpoint), device="cpu", dtype="float32")
    model, tokenizer = loaded.model, loaded.tokenizer
    cpu, pad = torch.device("cpu"), tokenizer.pad_token_id
    assert pads_change_logits(model, pad, cpu)
    assert not pads_change_logits(tiny.tiny_model("llama").float(), pad, cpu)
    rows = ["ab", "ab", "xy", "abcdefgh", "abc"]
    assert _spans(rows, 2, tokenizer, True) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert _spans(rows, 2, tokenizer, False) == [(0, 2), (2, 4), (4, 5)]
    prompts = ["ab", "abcdefgh", "xy", "abc"]
    kwargs = dict(num_samples=2, max_new_tokens=6, temperature=0.0, seed=0)
    batched = sample(model, tokenizer, prompts, **kwargs)
    for i, prompt in enumerate(prompts):
        alone = sample(model, tokenizer, [prompt], **kwargs)
        expected = alone.completion_ids[0][alone.completion_mask[0]].tolist()
        for row in (2 * i, 2 * i + 1):
            assert batched.completion_ids[row][batched.completion_mask[row]].tolist() == expected
