"""The CD-RFT regulariser step and the near-hard projection loop (SPEC §5 steps 2 and 4).

On a fixed probe (drawn once from the run's seed, identical for both arms):

* ``measure`` — C at the current theta (``control.control_autograd``, one gate-only
  backward), then B_shared(C) and R(C) (``spectral``), both as fractions.
* ``add_regularizer_grad`` — step 2: grad_theta R(C(theta)) from
  ``regularizer.regularizer_grad`` (exact / proxy / Richardson), times lambda, added to
  the parameters' ``.grad`` on top of the backbone gradient. The optimizer step then
  uses grad L_post + lambda grad R.
* ``project`` — step 4: while B_shared(C on the probe) > tau and fewer than K_max
  iterations, recompute C̄, W and the regulariser gradient and take a plain step
  theta <- theta - eta_proj * grad R (no optimizer state involved), then re-measure.

Every measurement is the regulariser's first pass at the same theta (C̄ and l_m), so
it is handed over rather than computed twice.

Nothing here re-derives C, W or the proxy: it composes the library's estimators. The
order these run in within an optimizer step, the carried measurement, the finite checks
and the log columns belong to ``train.step.CDRFTStep``, which both backends drive.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.utils import get_total_norm

from cdscope.analysis.spectral import b_shared, moment_ratio
from cdscope.core.batch import ProbeBatch, encode_probe
from cdscope.core.control import ControlResult, control_autograd
from cdscope.core.gating.model import GatedModel
from cdscope.core.probes import ProbePool, draw_probe
from cdscope.core.regularizer import GradResult, regularizer_grad
from cdscope.core.routing import RoutingCount
from cdscope.errors import CdscopeError
from cdscope.train.engine import local, whole


@dataclass(frozen=True)
class ProbeMeasure:
    """B_shared and R (fractions) of C on the probe, with the families kept and the
    measurement itself (the regulariser's first pass at the same theta)."""

    b_shared: float
    R: float  # noqa: N815 - SPEC symbol
    families: tuple[str, ...]
    control: ControlResult = field(repr=False, compare=False)


@dataclass
class ProjectionResult:
    iterations: int
    before: ProbeMeasure  # right after the optimizer step
    after: ProbeMeasure  # after the last projection step (== before when none ran)
    seconds: float
    #: the routing decisions the projection's first-order estimates held (MoE; else empty)
    routing: RoutingCount = RoutingCount()
    #: the largest ||grad R|| an iteration stepped along (0: none ran)
    grad_norm_max: float = 0.0
    #: the length of the path theta moved: sum over iterations of eta_proj * s * ||grad R||
    moved: float = 0.0


def build_probe(
    pool: ProbePool,
    tokenizer: object,
    seed: int,
    n: int,
    families: Sequence[str],
    template: str = "plain",
    device: torch.device | str = "cpu",
    max_tokens: int | None = None,
) -> ProbeBatch:
    """The run's fixed probe: ``n`` items per family from ``seed`` (SPEC §4 draw), each
    row cut to ``max_tokens`` (``cap_probe``) when given."""
    missing = [f for f in families if f not in pool.families]
    if missing:
        raise CdscopeError(
            f"probe pool has no items for training family/families {', '.join(missing)} "
            f"(pool families: {', '.join(pool.families)}); add them with --probe"
        )
    pad_id = getattr(tokenizer, "pad_token_id", None) or 0
    batch = encode_probe(draw_probe(pool, seed, n, families), tokenizer, template, pad_id=pad_id)
    if max_tokens is not None:
        batch = cap_probe(batch, max_tokens, pad_id)
    return batch.to(torch.device(device))


def cap_probe(batch: ProbeBatch, max_tokens: int, pad_id: int = 0) -> ProbeBatch:
    """``--probe-max-tokens``: every row at most ``max_tokens`` tokens. A longer row loses
    prompt tokens from the left (the context nearest the target stays) down to one prompt
    token; a target longer than ``max_tokens - 1`` tokens then loses its end (fewer scored
    tokens). C on the capped probe is the control of the shortened items' likelihood
    (SPEC §2 with x cut to its last tokens): a different probe, whose B_shared is comparable
    only with runs capped alike (docs/train.md)."""
    rows, starts = [], []
    for b in range(batch.B):
        length, start = int(batch.lengths[b]), int(batch.target_start[b])
        ids = batch.input_ids[b, :length]
        cut = min(max(length - max_tokens, 0), start - 1)  # prompt tokens dropped on the left
        ids, start = ids[cut:], start - cut
        rows.append(ids[:max_tokens])
        starts.append(start)
    width = max(len(r) for r in rows)
    input_ids = torch.full(
        (batch.B, width), pad_id, dtype=torch.long, device=batch.input_ids.device
    )
    for b, row in enumerate(rows):
        input_ids[b, : len(row)] = row
    return ProbeBatch(
        input_ids, torch.tensor([len(r) for r in rows]), torch.tensor(starts),
        list(batch.families), batch.row_family.clone(), list(batch.item_ids),
    )  # fmt: skip


def measure_probe(gm: GatedModel, batch: ProbeBatch, batch_size: int | None = None) -> ProbeMeasure:
    """B_shared(C) and R(C) at the current parameters (SPEC §2-3)."""
    result = control_autograd(gm, batch, batch_size)
    C = result.C_kept()  # noqa: N806
    if C.shape[0] == 0:
        raise CdscopeError(
            "every probe family has |l_m| < 1e-4: C cannot be normalised on this probe"
        )
    kept = [f for f, k in zip(result.families, result.kept, strict=True) if k]
    return ProbeMeasure(float(b_shared(C)), float(moment_ratio(C)), tuple(kept), result)


def add_regularizer_grad(
    gm: GatedModel,
    batch: ProbeBatch,
    params: Sequence[nn.Parameter],
    lam: float,
    estimator: str,
    eps: float,
    batch_size: int | None = None,
    at: ProbeMeasure | None = None,
) -> GradResult:
    """p.grad += lambda * dR/dp for every ``p`` in ``params`` (SPEC §5 step 2).

    ``at``: the probe measurement at the current theta, when the caller has one (it
    replaces the estimator's own first pass)."""
    result = regularizer_grad(
        gm, batch, estimator, eps, params, batch_size=batch_size,
        nominal=at.control if at is not None else None,
    )  # fmt: skip
    with torch.no_grad():
        for p, g in zip(params, result.grads, strict=True):
            scaled = g.to(p.dtype) * lam
            if p.grad is None:
                p.grad = scaled.clone()
            else:
                p.grad.add_(scaled)
    return result


def project(
    gm: GatedModel,
    batch: ProbeBatch,
    params: Sequence[nn.Parameter],
    tau: float,
    k_max: int,
    eta_proj: float,
    estimator: str,
    eps: float,
    batch_size: int | None = None,
    start: ProbeMeasure | None = None,
    agreed: Callable[[float], float] = float,
    max_norm: float | None = None,
) -> ProjectionResult:
    """The inner loop (SPEC §5 step 4); ``tau`` in percent, like ``--tau``.

    Each iteration steps theta <- theta - eta_proj * s * grad R with s = 1 (SPEC's plain
    step) or, with ``max_norm`` X (``--proj-max-norm``), s = min(1, X / ||grad R||): the
    step never moves theta further than eta_proj * X, whatever a spike of grad R would ask
    (docs/train.md, "When the projection breaks the policy"). ``start`` is the measurement
    at the current theta when the caller already has it. ``agreed`` maps this rank's B_shared to the one
    every rank decides on (sharded runs: rank 0's, ``engine.Shards.from_rank_zero``), so
    all ranks run the same iterations.
    """
    began = time.perf_counter()
    current = start or measure_probe(gm, batch, batch_size)
    before = current
    iterations, routing, largest, moved = 0, RoutingCount(), 0.0, 0.0
    while agreed(current.b_shared) * 100.0 > tau and iterations < k_max:
        result = regularizer_grad(
            gm, batch, estimator, eps, params, batch_size=batch_size, nominal=current.control
        )
        routing += result.routing or RoutingCount()
        norm = float(whole(get_total_norm(result.grads)))  # DTensor shards: a collective
        scale = 1.0 if max_norm is None or norm <= max_norm else max_norm / norm
        with torch.no_grad():
            for p, g in zip(params, result.grads, strict=True):
                p.sub_(g.to(p.dtype), alpha=eta_proj * scale)
        largest = max(largest, norm)
        moved += eta_proj * scale * norm
        iterations += 1
        current = measure_probe(gm, batch, batch_size)
    seconds = time.perf_counter() - began
    return ProjectionResult(iterations, before, current, seconds, routing, largest, moved)


def finite_params(params: Sequence[nn.Parameter]) -> bool:
    """True when every parameter (and gradient, where set) is finite -- on this rank's
    shards for DTensor parameters (the caller agrees over ranks: ``engine.Shards.all``)."""
    for p in params:
        if not bool(torch.isfinite(local(p.detach())).all()):
            return False
        if p.grad is not None and not bool(torch.isfinite(local(p.grad)).all()):
            return False
    return True
