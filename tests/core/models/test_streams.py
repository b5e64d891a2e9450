"""Several residual streams (hyper-connections, issue 31): expanded writes ``e (x) a``
discovered and proven on HY-V4 and Qwen4-exp, what a gate does to the streams, F of an
expanded write, and DeepSeek-V4 (whose carried streams are mixed) still refused."""

from __future__ import annotations

import pytest
import torch

from cdscope.core.gating.model import GatedModel
from cdscope.core.models import discovery as d
from cdscope.core.models import streams
from cdscope.core.models.architecture import architecture_of
from cdscope.errors import CdscopeError
from cdscope.tools import coverage, tiny

#: (type, its stream-weights modules of layer 0): HY-V4's ``post`` is the first output of
#: its hyper-connection, Qwen4-exp's injection weights the third
EXPANDED = {
    "hy_v4": (("attn_hc", 0), ("ffn_hc", 0)),
    "qwen4_exp_text": (("attn_hyper_connection", 2), ("mlp_hyper_connection", 2)),
}


@pytest.mark.parametrize("model_type", sorted(EXPANDED))
def test_expanded_writes_are_discovered_and_proven(model_type: str) -> None:
    arch = architecture_of(tiny.tiny_model(model_type))
    writes = arch.layer_writes(0)
    assert [(w.expand.rsplit(".", 1)[-1], w.expand_index) for w in writes] == list(
        EXPANDED[model_type]
    )
    assert arch.proof.unit_gates_exact and arch.proof.zero_gates_error == 0.0
    assert arch.proof.write_sum_error <= arch.proof.write_sum_tolerance


def _stream_io(model: torch.nn.Module, gm: GatedModel, gates: torch.Tensor, ids: torch.Tensor):
    seen = {}
    blocks = gm.architecture.layers(model)
    handle = blocks[0].register_forward_hook(
        lambda m, args, kwargs, out: seen.update(h_in=d.input_tensor(args, kwargs), h_out=out),
        with_kwargs=True,
    )
    try:
        with gm.gating(gates, capture_norms=True) as cap:
            model(input_ids=ids)
    finally:
        handle.remove()
    return seen["h_in"], seen["h_out"], cap


def test_a_gate_scales_the_whole_expanded_write() -> None:
    """Qwen4-exp, float64: closing layer 0's MLP gate changes the streams by exactly
    -(e (x) a) of that write (its stream weights e come from the streams before it, so a
    gate on a scales e (x) a), and its F is |e| |a| per position."""
    model = tiny.tiny_model("qwen4_exp_text")
    ids = tiny.random_batch().input_ids[:1, :7]
    with GatedModel(model) as gm:
        arch = gm.architecture
        mlp = arch.layer_writes(0)[1]
        e, a = {}, {}
        hooks = [
            model.get_submodule(mlp.expand).register_forward_hook(
                lambda m, i, out: e.update(v=out[mlp.expand_index])
            ),
            model.get_submodule(mlp.path).register_forward_hook(lambda m, i, out: a.update(v=out)),
        ]
        try:
            ones = torch.ones(1, arch.K, dtype=torch.float64)
            h_in, open_out, cap = _stream_io(model, gm, ones, ids)
            expected = streams.expand(e["v"], a["v"], h_in)
            manual = e["v"].double().norm(dim=-1) * a["v"].double().norm(dim=-1)
            norms = cap.norms[1]
            closed = ones.clone()
            closed[0, 1] = 0.0
            _, closed_out, _ = _stream_io(model, gm, closed, ids)
        finally:
            for hook in hooks:
                hook.remove()
    removed = (open_out - closed_out).double()
    # floor 8.7e-18 (one float64 rounding of H + e (x) a, |e (x) a| <= 9.1e-3) measured at
    # 1 and 2 threads; 1e-15 is a margin of 100
    assert (removed - expected).abs().max() <= 1e-15
    assert torch.allclose(
        norms.double(), manual.reshape(norms.shape), rtol=1e-12, atol=0
    )  # float64 products


def test_c_of_expanded_writes_agrees_with_finite_differences() -> None:
    """Float64 throughout: autograd C against central differences (coverage.fd_agreement);
    measured 2.9e-11 (Qwen4-exp) and 5.0e-11 (HY-V4) against coverage's 1e-6 bound."""
    for model_type in EXPANDED:
        assert coverage.fd_agreement(tiny.tiny_model(model_type)) <= coverage.FD_TOLERANCE


def test_finer_granularities_are_refused_on_several_streams() -> None:
    with pytest.raises(CdscopeError, match="several residual streams"):
        GatedModel(tiny.tiny_model("hy_v4"), granularity="head")


def test_deepseek_v4_mixes_its_carried_streams_and_stays_refused() -> None:
    """DeepSeek-V4 carries comb^T H, not H: no expanded write set fits its update."""
    with pytest.raises(CdscopeError, match="carries 4 residual streams"):
        architecture_of(tiny.tiny_model("deepseek_v4"))


def test_stream_count_and_the_float32_adding_dtype() -> None:
    write = torch.zeros(2, 6, 64)
    assert streams.stream_count(torch.zeros(2, 6, 4, 64), write) == 4
    assert streams.stream_count(torch.zeros(2, 6, 256), write) == 4
    assert streams.stream_count(torch.zeros(2, 6, 64), write) == 0
    assert streams.stream_count(torch.zeros(2, 6, 100), write) == 0
    exact = torch.randn(3, 5, dtype=torch.float32).double()
    assert d.adding_dtype(exact, torch.float64) == torch.float32
    assert d.adding_dtype(exact + 1e-12, torch.float64) == torch.float64
    assert d.adding_dtype(exact.float(), torch.float32) == torch.float32
