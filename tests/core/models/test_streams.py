"""Several residual streams (hyper-connections, issue 31): expanded writes ``e (x) a``
discovered and proven on HY-V4, Qwen4-exp and DeepSeek-V4 (whose carried streams are
mixed, ``H' = comb^T H + e (x) a``: the mixed-carry proof), what a gate does to the
streams, F of an expanded write, and tampered mixed-carry blocks refused by the proof."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from cdscope.commands.inspect import run_inspect
from cdscope.core.gating.model import GatedModel
from cdscope.core.models import discovery as d
from cdscope.core.models import streams
from cdscope.core.models.architecture import architecture_of, discover
from cdscope.core.models.loading import load_model
from cdscope.core.models.proof import prove
from cdscope.errors import CdscopeError
from cdscope.output.render_models import layout_notes
from cdscope.tools import coverage, tiny

#: (type, its stream-weights modules of layer 0): HY-V4's and DeepSeek-V4's ``post`` is
#: the first output of its hyper-connection, Qwen4-exp's injection weights the third
EXPANDED = {
    "hy_v4": (("attn_hc", 0), ("ffn_hc", 0)),
    "qwen4_exp_text": (("attn_hyper_connection", 2), ("mlp_hyper_connection", 2)),
    "deepseek_v4": (("attn_hc", 0), ("ffn_hc", 0)),
}
#: the types whose steps carry comb^T H (``comb``: the second output of the same module)
MIXED = {"deepseek_v4"}


@pytest.mark.parametrize("model_type", sorted(EXPANDED))
def test_expanded_writes_are_discovered_and_proven(model_type: str) -> None:
    arch = architecture_of(tiny.tiny_model(model_type))
    writes = arch.layer_writes(0)
    assert [(w.expand.rsplit(".", 1)[-1], w.expand_index) for w in writes] == list(
        EXPANDED[model_type]
    )
    if model_type in MIXED:  # each step carries comb^T H of its own hyper-connection
        assert [w.mix for w in writes] == [
            streams.Mixing(w.expand, 1, transposed=True) for w in writes
        ]
    else:
        assert all(w.mix is None for w in arch.writes)
    assert arch.proof.unit_gates_exact and arch.proof.zero_gates_error == 0.0
    assert arch.proof.write_sum_error <= arch.proof.write_sum_tolerance
    assert arch.proof.carry == ("mixed" if model_type in MIXED else "identity")


def test_inspect_says_how_writes_enter_mixed_streams(deepseek_v4_dir) -> None:  # noqa: ANN001
    """``cdscope inspect`` on the checkpoint: each write's stream weights and mixed carry,
    and a proof line that does not claim zero gates leave the streams unchanged."""
    record = run_inspect(str(deepseek_v4_dir))
    assert [w["streams"] for w in record["layers"][1]["writes"]] == [
        "expanded by attn_hc, mixed carry of attn_hc",
        "expanded by ffn_hc, mixed carry of ffn_hc",
    ]
    assert "zero gates leave each step's mixed carry" in layout_notes(record)[0]


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


#: |closed - open - e (x) a| bound per type: floor 8.7e-18 (Qwen4-exp: one float64 rounding
#: of H + e (x) a, |e (x) a| <= 9.1e-3) and 5.6e-17 (DeepSeek-V4: one rounding of
#: comb^T H + e (x) a, |e (x) a| <= 0.14) measured at 1 and 2 threads; 1e-15 is a margin
#: of 18 over the larger
REMOVED_BOUND = 1e-15


@pytest.mark.parametrize("model_type", ["qwen4_exp_text", "deepseek_v4"])
def test_a_gate_scales_the_whole_expanded_write(model_type: str) -> None:
    """Float64: closing layer 0's MLP gate changes the streams by exactly -(e (x) a) of that
    write (its stream weights e, and DeepSeek-V4's carry comb^T H, come from the streams
    before it, so a gate on a scales e (x) a alone), and its F is |e| |a| per position."""
    model = tiny.tiny_model(model_type)
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
    assert (removed - expected).abs().max() <= REMOVED_BOUND
    assert torch.allclose(
        norms.double(), manual.reshape(norms.shape), rtol=1e-12, atol=0
    )  # float64 products


def test_c_of_expanded_writes_agrees_with_finite_differences() -> None:
    """Float64 throughout: autograd C against central differences (coverage.fd_agreement);
    measured 2.9e-11 (Qwen4-exp), 5.0e-11 (HY-V4) and 1.5e-11 (DeepSeek-V4, at 1 and 2
    threads) against coverage's 1e-6 bound."""
    for model_type in EXPANDED:
        assert coverage.fd_agreement(tiny.tiny_model(model_type)) <= coverage.FD_TOLERANCE


def test_finer_granularities_are_refused_on_several_streams() -> None:
    with pytest.raises(CdscopeError, match="several residual streams"):
        GatedModel(tiny.tiny_model("hy_v4"), granularity="head")


#: DeepSeek-V4 loaded by path in float64: autograd C vs central differences, floor 1.5e-11
#: measured at 1 and 2 threads; 1e-9 is a margin of 65
FD_BOUND_DSV4 = 1e-9


@pytest.fixture(scope="module")
def deepseek_v4_dir(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """A tiny DeepSeek-V4 saved with ``save_pretrained`` (float32), a user's checkpoint."""
    return tiny.save_checkpoint(tiny.tiny_model("deepseek_v4"), tmp_path_factory.mktemp("dsv4"))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_deepseek_v4_by_path_is_proven_with_its_mixed_carry(deepseek_v4_dir, dtype: str) -> None:  # noqa: ANN001
    """comb^T H carried, post (x) a written: proven per step on the checkpoint loaded by
    path; with every gate at 0 each step is its carry alone, bit for bit; C agrees with
    central differences in float64 (``FD_BOUND_DSV4``)."""
    model = load_model(str(deepseek_v4_dir), device="cpu", dtype=dtype).model
    arch = architecture_of(model)
    assert arch.K == 4 and all(w.mix and w.mix.path == w.expand for w in arch.writes)
    assert [w.role for w in arch.writes] == ["attn", "moe", "attn", "moe"]
    assert arch.proof.unit_gates_exact and arch.proof.zero_gates_error == 0.0
    assert arch.proof.write_sum_error <= arch.proof.write_sum_tolerance
    assert arch.proof.carry == "mixed"
    if dtype == "float64":
        assert coverage.fd_agreement(model) <= FD_BOUND_DSV4


def _tampered(model: torch.nn.Module, tamper) -> str:  # noqa: ANN001
    """The proof's refusal of ``model`` after ``tamper(model, arch)`` (hooks the model or
    returns a changed description) on the description discovered before it."""
    arch, _, ids = discover(model)
    arch = tamper(model, arch) or arch
    with pytest.raises(CdscopeError) as caught:
        prove(model, arch, ids, d.run_probe(model, ids), 0.0)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_tampered_mixed_carry_is_refused() -> None:
    """Each check of the mixed-carry proof can fail: something added to a block's output
    outside its writes (check 2), a carry of the wrong orientation (M H instead of comb^T H:
    check 2 at layer 0's second step, where the streams differ), and something written
    between two blocks (check 3's chain: every block's input is the previous output)."""

    def added(model: torch.nn.Module, arch) -> None:  # noqa: ANN001
        model.model.layers[0].register_forward_hook(lambda m, i, out: out + 1e-3)

    def flipped(model: torch.nn.Module, arch):  # noqa: ANN001, ANN202
        writes = [replace(w, mix=replace(w.mix, transposed=False)) for w in arch.writes]
        return replace(arch, writes=tuple(writes))

    def between(model: torch.nn.Module, arch) -> None:  # noqa: ANN001
        model.model.layers[1].register_forward_pre_hook(lambda m, a: (a[0] + 1e-3, *a[1:]))

    for tamper, layer, what in [
        (added, 0, "block output - input != sum of its gated writes after its mixed carry"),
        (flipped, 0, "block output - input != sum of its gated writes after its mixed carry"),
        (between, 1, "with every gate at 0 the streams differ from their mixed carry"),
    ]:
        message = _tampered(tiny.tiny_model("deepseek_v4"), tamper)  # a fresh model each
        assert f"proof failed at layer {layer}: {what}" in message, message


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


def test_carry_against_an_explicit_sum() -> None:
    """``streams.carry``: (M^T H)_i = sum_j M_ji H_j (M H with ``transposed=False``), the
    same for streams flattened to ``[..., n * D]``; float64, against an einsum."""
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(2, 6, 4, 8, dtype=torch.float64, generator=gen)
    m = torch.randn(2, 6, 4, 4, dtype=torch.float64, generator=gen).softmax(-1)
    moved = streams.carry(m, h, transposed=True)
    # floor 0.0 measured at 1 and 2 threads (|M^T H| <= 2.6); 1e-14 is about 20 float64
    # epsilons of the largest value: room for a BLAS that sums the 4 products in another order
    assert (moved - torch.einsum("btji,btjd->btid", m, h)).abs().max() <= 1e-14
    assert (
        streams.carry(m, h, transposed=False) - torch.einsum("btij,btjd->btid", m, h)
    ).abs().max() <= 1e-14
    assert torch.equal(
        streams.carry(m, h.reshape(2, 6, 32), transposed=True), moved.reshape(2, 6, 32)
    )
    assert not torch.equal(moved, streams.carry(m, h, transposed=False))
