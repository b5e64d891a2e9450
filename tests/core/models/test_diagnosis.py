"""The measured reasons a block is not a sum of residual writes (issue 31,
``cdscope.core.models.diagnosis``), on the tiny coverage models of the types they name, and
the new layouts that are supported (LongCat-Flash's five writes, Zamba's shared
transformer that feeds its mixer instead of the stream)."""

from __future__ import annotations

import pytest
import torch

from cdscope.core.models import diagnosis, streams
from cdscope.core.models import discovery as d
from cdscope.core.models.architecture import architecture_of
from cdscope.errors import CdscopeError
from cdscope.tools import tiny


def _trace(model_type: str, layer: int = 0) -> tuple[torch.nn.Module, d.BlockTrace, str]:
    model = tiny.tiny_model(model_type)
    path, blocks = d.find_blocks(model)
    trace = d.trace_forward(model, blocks, d.probe_ids(model, torch.device("cpu")))
    return model, trace.blocks[layer], f"{path}.{layer}."


@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        # HRM: the low-level stack runs H_cycles x L_cycles = 2 x 3 times per forward
        ("hrm_text", "the block runs 6 times in one forward"),
        # (HY-V4, Qwen4-exp and DeepSeek-V4, whose mixing is identified: .../test_streams.py)
        # Gemma-3n's AltUp: 4 predictions stacked in front of the batch
        ("gemma3n_text", "the block carries 4 residual streams (hidden state [4, 1, 6, 64])"),
        # MiniMax's DeepNorm-style block adds its MLP to the normalised stream
        ("minimax", "passes through the norm post_attention_layernorm inside the block"),
        # (RWKV's pre_ln of the embeddings in block 0 starts the stream: test_rwkv.py)
        ("bert", "passes through the norm output.LayerNorm inside the block"),
        ("openai-gpt", "passes through the norm ln_2 inside the block"),
        # Beam's depth-scaled residual: h' = a / sqrt(i) + h sqrt((i - 1) / i) per sublayer
        ("beam", "the block scales the stream it carries"),
        # Inkling-2's block-attention residuals: layer 0 starts a block afresh
        ("inkling2_text", "no h_in term of its own"),
    ],
)
def test_refusal_names_what_is_not_additive(model_type: str, reason: str) -> None:
    """In float32: Inkling-2's router fails in float64 (its float32 cast meets a float64
    weight), the plain load the coverage page reads first."""
    with pytest.raises(CdscopeError) as caught:
        architecture_of(tiny.tiny_model(model_type).float())
    assert reason in str(caught.value)
    assert diagnosis.GENERIC not in str(caught.value)


def test_an_additive_block_has_no_reason_to_refuse() -> None:
    """Each check can fail: on Llama (h_out = h_in + attn + mlp) none of them fires."""
    model, trace, prefix = _trace("llama")
    assert trace.calls == 1
    assert diagnosis.recurrent(trace) is None
    assert diagnosis.several_streams(trace, prefix) is None
    assert diagnosis.through_norm(trace, model, prefix, torch.float64) is None
    assert diagnosis.replaces_stream(trace, torch.float64) is None


def test_the_checks_fire_on_their_measurements() -> None:
    """The same Llama trace, changed as each refused layout would change it."""
    model, trace, prefix = _trace("llama")
    trace.calls = 3
    assert "runs 3 times" in diagnosis.recurrent(trace)
    norm = trace.records[prefix + "post_attention_layernorm"]
    restarted = d.BlockTrace(trace.h_in, 2.0 * norm.out, trace.records)
    assert "passes through the norm post_attention_layernorm" in diagnosis.through_norm(
        restarted, model, prefix, torch.float64
    )
    attn, mlp = trace.records[prefix + "self_attn"], trace.records[prefix + "mlp"]
    fresh = d.BlockTrace(trace.h_in, attn.out + mlp.out, trace.records)
    assert "no h_in term of its own" in diagnosis.replaces_stream(fresh, torch.float64)
    wide = d.BlockTrace(trace.h_in.repeat(1, 1, 3), trace.h_out.repeat(1, 1, 3), trace.records)
    assert "carries 3 residual streams" in diagnosis.several_streams(wide, prefix)


def test_a_mixing_that_cannot_be_identified_is_refused() -> None:
    """DeepSeek-V4's layer 1 as traced fits a mixed carry; with its second step's mixing
    matrix replaced by the identity (a carry that is not the one the block applied) no
    expanded-write form fits, and the refusal names the several streams."""
    model, trace, prefix = _trace("deepseek_v4", layer=1)
    assert streams.solve_expanded(trace, torch.float64) is not None
    ffn_hc = trace.records[prefix + "ffn_hc"]
    post, comb, collapsed = ffn_hc.outs
    ffn_hc.outs = (post, torch.eye(4, dtype=comb.dtype).expand_as(comb), collapsed)
    assert streams.solve_expanded(trace, torch.float64) is None
    reason = diagnosis.why_not_additive(trace, model, prefix, torch.float64)
    assert reason.startswith("the block carries 4 residual streams (hidden state [1, 6, 4, 64])")
    assert "neither H + e (x) a nor a mixed carry M^T H + e (x) a fits" in reason


def test_longcat_flash_has_five_writes_a_layer() -> None:
    """Two attention + MLP pairs and the shortcut MoE (read after the first attention,
    added last): the OVERRIDES entry, proven like a discovered layout."""
    arch = architecture_of(tiny.tiny_model("longcat_flash"))
    assert [w.path.split(".", 3)[-1] for w in arch.layer_writes(1)] == [
        "self_attn.0",
        "mlp.experts",
        "mlps.0",
        "self_attn.1",
        "mlps.1",
    ]
    assert arch.source == "override" and arch.K == 10
    assert arch.proof.zero_gates_error == 0.0 and arch.proof.unit_gates_exact


def test_zamba_shared_transformer_feeds_the_mixer_not_the_stream() -> None:
    """Zamba's hybrid layer adds its shared transformer's output to the Mamba input only
    (``residual`` is taken before): one write, the mixer, as in the plain Mamba layers."""
    arch = architecture_of(tiny.tiny_model("zamba"))
    assert [w.path for w in arch.layer_writes(2)] == ["model.layers.2.mamba_decoder.mamba"]
    assert arch.proof.zero_gates_error == 0.0
