"""Discovery + proof of the residual writes (issue 12): layouts of named architectures,
the proof's three checks failing where they must, bad inputs, and a custom-code model
refused by inspect (the commands on the named types: tests/core/models/test_arch_e2e.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cdscope.core.models.architecture import architecture_of, discover
from cdscope.core.models.proof import prove
from cdscope.errors import CdscopeError
from cdscope.tools import tiny
from tests.helpers import NAMED, byte_tokenizer, invoke, tiny_model

#: the issue's named types: (roles of layer 0, roles of layer 1, parallel, post-norm)


@pytest.mark.parametrize("model_type", sorted(NAMED))
def test_named_architectures_are_discovered_and_proven(model_type: str) -> None:
    layer0, layer1, parallel, post = NAMED[model_type]
    arch = architecture_of(tiny.tiny_model(model_type))
    assert (arch.roles(0), arch.roles(1)) == (layer0, layer1)
    assert len(layer0) + len(layer1) == arch.K
    assert any(w.parallel for w in arch.writes) == parallel
    assert any(w.post_norm for w in arch.writes) == post
    proof = arch.proof
    assert proof.unit_gates_exact and proof.write_sum_error <= proof.write_sum_tolerance
    assert proof.zero_gates_error == 0.0


def test_llama_post_attention_norm_is_a_pre_norm_but_gemma2s_is_a_post_norm() -> None:
    """Same module name, opposite data flow: the gate follows the data flow."""
    llama = architecture_of(tiny_model("llama"))
    assert [w.path for w in llama.layer_writes(0)] == [
        "model.layers.0.self_attn",
        "model.layers.0.mlp",
    ]
    assert llama.writes[1].pre_norm == "model.layers.0.post_attention_layernorm"
    gemma = architecture_of(tiny_model("gemma2"))
    assert [w.path for w in gemma.layer_writes(0)] == [
        "model.layers.0.post_attention_layernorm",
        "model.layers.0.post_feedforward_layernorm",
    ]
    assert gemma.writes[0].sublayer == "model.layers.0.self_attn" and gemma.writes[0].post_norm


def test_neox_mlp_reads_the_block_input_through_its_own_norm() -> None:
    arch = architecture_of(tiny_model("gpt_neox"))
    attn, mlp = arch.layer_writes(0)
    assert not attn.parallel and mlp.parallel
    assert mlp.pre_norm == "gpt_neox.layers.0.post_attention_layernorm"


def _wrong(arch, **changes):  # noqa: ANN001, ANN202
    writes = list(arch.writes)
    writes[1] = replace(writes[1], **changes)
    return replace(arch, writes=tuple(writes))


def test_proof_refuses_a_description_whose_writes_do_not_sum() -> None:
    """A gate on the pre-MLP norm instead of the MLP: the write sum is off at layer 0."""
    model = tiny_model("llama")
    arch, trace, ids = discover(model)
    bad = _wrong(arch, path="model.layers.0.post_attention_layernorm")
    with pytest.raises(CdscopeError, match=r"layer 0: block output - input != sum.*rel\. error"):
        prove(model, bad, ids, trace.logits, 0.0)


def test_proof_refuses_a_wrong_residual_multiplier() -> None:
    model = tiny_model("llama")
    arch, trace, ids = discover(model)
    with pytest.raises(CdscopeError, match="layer 0"):
        prove(model, _wrong(arch, scale=0.5), ids, trace.logits, 0.0)


def test_proof_refuses_a_stream_written_outside_the_gates() -> None:
    """An extra write after every block (a hook) is caught, at discovery or by the proof."""
    model = tiny_model("llama")
    handles = [b.register_forward_hook(lambda m, a, o: o + 0.1) for b in model.model.layers]
    try:
        with pytest.raises(CdscopeError, match="layer 0"):
            architecture_of(model)
    finally:
        for h in handles:
            h.remove()


def test_proof_refuses_gates_that_are_not_identities() -> None:
    model = tiny_model("llama")
    arch, trace, ids = discover(model)
    with pytest.raises(CdscopeError, match="unit gates change the logits"):
        prove(model, arch, ids, trace.logits + 1e-3, 0.0)


def test_post_layer_norm_and_encoder_decoder_models_are_refused() -> None:
    from transformers import BertConfig, BertLMHeadModel, T5Config, T5ForConditionalGeneration

    bert = BertLMHeadModel(
        BertConfig(
            vocab_size=300,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            is_decoder=True,
        )
    ).eval()
    with pytest.raises(CdscopeError, match="no set of module outputs sums"):
        architecture_of(bert)
    t5 = T5ForConditionalGeneration(
        T5Config(vocab_size=300, d_model=32, d_ff=64, num_layers=1, num_heads=4, d_kv=8)
    )
    with pytest.raises(CdscopeError, match="encoder-decoder"):
        architecture_of(t5)


def test_custom_code_model_whose_writes_cannot_be_found_is_refused(tmp_path) -> None:
    """A --trust-remote-code post-LN model from a local modeling file: exit 2, one line."""
    directory = tmp_path / "custom"
    directory.mkdir()
    (directory / "modeling_postln.py").write_text(_POST_LN_CODE)
    config = {
        "model_type": "postln",
        "architectures": ["PostLNForCausalLM"],
        "auto_map": {
            "AutoConfig": "modeling_postln.PostLNConfig",
            "AutoModelForCausalLM": "modeling_postln.PostLNForCausalLM",
        },
        "vocab_size": 300,
        "hidden_size": 32,
        "num_hidden_layers": 2,
    }
    (directory / "config.json").write_text(json.dumps(config))
    byte_tokenizer().save_pretrained(directory)
    from transformers import AutoConfig, AutoModelForCausalLM

    remote = AutoConfig.from_pretrained(directory, trust_remote_code=True)
    AutoModelForCausalLM.from_config(remote, trust_remote_code=True).save_pretrained(directory)
    result = invoke("inspect", "--model", directory, "--trust-remote-code")
    assert result.exit_code == 2
    assert "no set of module outputs sums" in result.output
    assert len(result.output.strip().splitlines()) <= 3  # one (soft-wrapped) line


_POST_LN_CODE = """
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput


class PostLNConfig(PretrainedConfig):
    model_type = "postln"

    def __init__(self, vocab_size=300, hidden_size=32, num_hidden_layers=2, **kw):
        self.vocab_size, self.hidden_size = vocab_size, hidden_size
        self.num_hidden_layers = num_hidden_layers
        super().__init__(**kw)


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.mix, self.ff, self.ln = nn.Linear(h, h), nn.Linear(h, h), nn.LayerNorm(h)

    def forward(self, x):
        return self.ln(x + self.mix(x) + torch.tanh(self.ff(x)))


class PostLNModel(PreTrainedModel):
    config_class = PostLNConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config.hidden_size) for _ in range(config.num_hidden_layers))
        self.post_init()

    def forward(self, input_ids=None, **kw):
        x = self.embed(input_ids)
        for block in self.layers:
            x = block(x)
        return BaseModelOutput(last_hidden_state=x)


class PostLNForCausalLM(PreTrainedModel):
    config_class = PostLNConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.model = PostLNModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, input_ids=None, **kw):
        return CausalLMOutput(logits=self.lm_head(self.model(input_ids).last_hidden_state))
"""
