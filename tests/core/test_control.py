"""C, F and l_m: the batched autograd estimator against slow, obviously-correct twins (SPEC §2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cdscope.core.batch import encode_probe
from cdscope.core.control import EPS0, ControlResult, control_autograd, control_finite_difference
from cdscope.core.gating.model import GatedModel
from cdscope.core.likelihood import row_target_logprobs
from cdscope.core.models.float64 import float64_throughout
from cdscope.core.probes import draw_probe, load_pool
from tests.helpers import tiny_model, write_pool


@pytest.fixture
def probe_batch(tmp_path, tokenizer):
    pool = load_pool([write_pool(tmp_path / "p.jsonl", {"a": 4, "b": 4, "c": 4})])
    return encode_probe(draw_probe(pool, seed=0, n=2), tokenizer, "plain", pad_id=258)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gpt_neox", "gemma2"])
def test_autograd_matches_finite_differences(arch: str, probe_batch) -> None:
    """Float64 throughout (transformers' Llama and Gemma-2 norms would round to float32:
    the old second-order check at h = 1e-2 sat at 1.2e-4 under a 1e-3 bound), fourth-order
    differences at h = 1e-3: floor 2.0e-11 over the four at 1 and 2 threads; 500x margin."""
    model = tiny_model(arch, "sdpa", dtype=torch.float64)
    with float64_throughout(), GatedModel(model) as gm:
        fast = control_autograd(gm, probe_batch)
        slow = control_finite_difference(gm, probe_batch, step=1e-3, batch_size=16, order=4)
    np.testing.assert_allclose(fast.ell, slow.ell, rtol=1e-12)
    assert _rel(fast.C, slow.C) < 1e-8
    assert _rel(fast.dl_dg, slow.dl_dg) < 1e-8
    np.testing.assert_allclose(fast.F, slow.F, rtol=1e-12)
    assert np.abs(fast.C).max() > 1e-4  # the check is not vacuous
    # per-sample quantities (the noise-corrected Gram's input) agree too, and average
    # back to the family values: dl_m/dg = mean_i dlog pi_i/dg, l_m = mean_i log pi_i
    assert _rel(fast.row_dlogp, slow.row_dlogp) < 1e-8
    np.testing.assert_allclose(fast.row_logp, slow.row_logp, rtol=1e-12)
    for m in range(len(fast.families)):
        rows = fast.row_family == m
        np.testing.assert_allclose(fast.row_dlogp[rows].mean(0), fast.dl_dg[m], rtol=1e-10)
        np.testing.assert_allclose(fast.row_logp[rows].mean(), fast.ell[m], rtol=1e-12)
        np.testing.assert_allclose(fast.row_F[rows].mean(0), fast.F[m], rtol=1e-12)


def test_micro_batching_does_not_change_results(probe_batch) -> None:
    model = tiny_model("qwen2", "sdpa", dtype=torch.float64)
    with GatedModel(model) as gm:
        whole = control_autograd(gm, probe_batch)
        for size in (1, 2, 4):
            part = control_autograd(gm, probe_batch, batch_size=size)
            # float64 sums of other chunk shapes: floor 2.8e-15 relative; 10^5x margin
            np.testing.assert_allclose(part.dl_dg, whole.dl_dg, rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(part.F, whole.F, rtol=1e-9)
            np.testing.assert_allclose(part.ell, whole.ell, rtol=1e-12)


def test_padded_batch_logprobs_equal_unpadded_full_forwards(probe_batch) -> None:
    """Slow twin for the scoring path: one sequence at a time, full logits, explicit loop."""
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    rows = torch.arange(probe_batch.B)
    with torch.no_grad():
        fast = row_target_logprobs(model, probe_batch, rows)
        for b in range(probe_batch.B):
            length, start = int(probe_batch.lengths[b]), int(probe_batch.target_start[b])
            ids = probe_batch.input_ids[b : b + 1, :length]
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            slow = sum(float(logp[t - 1, ids[0, t]]) for t in range(start, length))
            assert fast[b].item() == pytest.approx(slow, rel=1e-10)


def test_activation_matrix_against_explicit_loop(probe_batch) -> None:
    """F[m, k] = mean over samples of the mean over target-predicting positions of ||write_k||."""
    model = tiny_model("gpt2", "eager", dtype=torch.float64)
    with GatedModel(model) as gm:
        fast = control_autograd(gm, probe_batch)
    writes: dict[int, torch.Tensor] = {}
    modules = [m for block in model.transformer.h for m in (block.attn, block.mlp)]
    handles = [
        mod.register_forward_hook(
            lambda mod, a, out, k=k: writes.__setitem__(
                k, out[0] if isinstance(out, tuple) else out
            )
        )
        for k, mod in enumerate(modules)
    ]
    try:
        F = np.zeros_like(fast.F)  # noqa: N806
        counts = np.zeros(probe_batch.M)
        for b in range(probe_batch.B):
            length, start = int(probe_batch.lengths[b]), int(probe_batch.target_start[b])
            with torch.no_grad():
                model(input_ids=probe_batch.input_ids[b : b + 1, :length])
            m = int(probe_batch.row_family[b])
            for k in range(len(modules)):
                norms = [float(writes[k][0, t].norm()) for t in range(start - 1, length - 1)]
                F[m, k] += np.mean(norms)
            counts[m] += 1
        F /= counts[:, None]  # noqa: N806
    finally:
        for h in handles:
            h.remove()
    np.testing.assert_allclose(fast.F, F, rtol=1e-10)


def test_parameters_are_frozen_during_estimation_and_restored(probe_batch) -> None:
    model = tiny_model("llama", "sdpa")
    with GatedModel(model) as gm:
        control_autograd(gm, probe_batch)
    assert all(p.requires_grad for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())


def test_family_with_tiny_likelihood_is_dropped() -> None:
    gates = GatedModel(tiny_model("llama")).gate_set
    K = gates.K  # noqa: N806
    result = ControlResult(
        ["a", "b", "c"],
        gates,
        np.array([-2.0, -EPS0 / 2, -3.0]),
        np.arange(3 * K, dtype=float).reshape(3, K),
        np.ones((3, K)),
        "autograd",
    )
    assert result.dropped == ["b"]
    assert np.isnan(result.C[1]).all()
    np.testing.assert_allclose(result.C[0], result.dl_dg[0] / -2.0)
    assert result.C_kept().shape == (2, K)


def test_control_rows_are_normalised_by_ell(probe_batch) -> None:
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    with GatedModel(model) as gm:
        result = control_autograd(gm, probe_batch)
    np.testing.assert_allclose(result.C * result.ell[:, None], result.dl_dg, rtol=1e-12)
    assert (result.ell < 0).all()


def test_fourth_order_stencil_is_more_accurate_at_a_large_step(probe_batch) -> None:
    """At h = 0.1 the O(h^2) error is visible; the O(h^4) stencil removes most of it."""
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    with GatedModel(model) as gm:
        exact = control_autograd(gm, probe_batch)
        second = control_finite_difference(gm, probe_batch, step=0.1, batch_size=32)
        fourth = control_finite_difference(gm, probe_batch, step=0.1, batch_size=32, order=4)
    assert _rel(fourth.C, exact.C) < _rel(second.C, exact.C) / 5  # measured ratio 49


def test_a_half_precision_head_runs_in_float32(monkeypatch) -> None:
    """Mixed precision (docs/precision.md): a bf16 model's output head runs in float32 at
    the scored positions, in vocabulary chunks that change nothing; ``wide=False`` is the
    model's own bf16 head."""
    from cdscope.core.models import head

    model = tiny_model("llama", "sdpa", dtype=torch.bfloat16)
    hidden = torch.randn(5, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    weight = model.get_output_embeddings().weight.detach()
    slow = torch.stack([weight.float() @ h.float() for h in hidden])  # one row at a time
    wide = head.output_logits(model, hidden)
    assert wide.dtype == torch.float32
    # float32 sums in another order: floor 9.5e-8 of the largest logit at 1 and 2
    # threads (both comparisons); 100x margin. bf16 logits would be off by ~4e-3.
    scale = float(slow.abs().max())
    torch.testing.assert_close(wide, slow, rtol=0, atol=1e-5 * scale)
    monkeypatch.setattr(head, "HEAD_CHUNK", 7)  # 300 rows in 43 chunks
    chunked = head.output_logits(model, hidden)
    torch.testing.assert_close(chunked, wide, rtol=0, atol=1e-5 * scale)
    narrow = head.output_logits(model, hidden, wide=False)
    assert narrow.dtype == torch.bfloat16
    assert not torch.equal(narrow.float(), wide)  # bf16 rounding of the logits
