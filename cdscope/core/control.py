"""Control matrix C, activation matrix F and family log-likelihoods l_m (SPEC §2).

    l_m(g)    = mean over family m's samples of log pi(y* | x; g)
    C[m, k]   = (1 / l_m) * d l_m / d g_k            at g = 1
    F[m, k]   = mean over samples of the mean over target-predicting positions of
                || write_k[t] ||_2

Batched estimator (``control_autograd``): all families and samples go through one
padded forward with a per-row gate tensor ``g`` of shape ``[B, K]`` set to ones; since a
family's shared gate g_k feeds every row of the family, the chain rule gives

    d l_m / d g_k = sum_{b in m} d l_m / d g[b, k]

so one backward of ``sum_m l_m`` yields every row of C at once. Model parameters are
frozen (no weight gradients), so the backward costs about one forward.

Slow twin (``control_finite_difference``): central differences over 2K gated forwards,
no backward at all — run it in float64 for an exact check. On MoE models its perturbed
forwards keep each token's experts of the nominal forward (``cdscope.core.routing``): the
derivative autograd takes is that of the nominal routing branch, and a step that crossed a
routing switch would measure a jump instead (``ControlResult.routing`` counts them).

Families with |l_m| < eps0 = 1e-4 cannot be normalised; their C row is NaN and they
are listed in ``dropped``.

Both estimators also return the per-sample quantities behind the family means: each
batch row's log pi_b, d log pi_b / d g_k and F_b. With l_m held fixed, row m of C is
the mean of the per-sample contributions c_{m,i} = (1 / l_m) d log pi_i / d g_k, which
the noise-corrected Gram and the bootstrap of ``cdscope.analysis.noise`` need (SPEC §4).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cdscope.analysis.uncertainty import FamilySamples
from cdscope.core.batch import ProbeBatch, family_mean, mean_at_predicting_positions, row_chunks
from cdscope.core.gates.vocabulary import GateSet, gate_dtype
from cdscope.core.gating.model import GatedModel
from cdscope.core.grad_sink import gate_gradient
from cdscope.core.likelihood import row_target_logprobs
from cdscope.core.models.placement import execution_device
from cdscope.core.routing import RoutingCount, RoutingHold
from cdscope.errors import CdscopeError
from cdscope.finite import require_finite

EPS0 = 1e-4


@dataclass
class ControlResult:
    """Per-family results of one probe: l_m, dl_m/dg, C (NaN rows when dropped) and F."""

    families: list[str]
    gate_set: GateSet
    ell: np.ndarray  # [M]
    dl_dg: np.ndarray  # [M, K]
    F: np.ndarray  # [M, K]
    estimator: str
    row_family: np.ndarray | None = None  # [B] family index of each batch row
    row_logp: np.ndarray | None = None  # [B] log pi(y* | x; g = 1) per sample
    row_dlogp: np.ndarray | None = None  # [B, K] d log pi / d g_k per sample (unweighted)
    row_F: np.ndarray | None = None  # [B, K] F of each sample
    #: the gates the estimator measured (finite differences on a subset); others are NaN
    measured: tuple[int, ...] | None = None
    #: fd on an MoE model: the routing decisions its perturbed forwards held (routing.py)
    routing: RoutingCount | None = None

    def __post_init__(self) -> None:
        """No measurement with a NaN or inf in it exists: refuse it here, naming the first
        bad quantity (``finite.require_finite``), for every estimator and every caller.
        Gates left unmeasured on purpose (``measured``) hold NaN and are not checked."""
        cols = slice(None) if self.measured is None else list(self.measured)
        require_finite(
            (f"{name} of family {family!r}", values[m])
            for m, family in enumerate(self.families)
            for name, values in (("l_m", self.ell), ("dl_m/dg", self.dl_dg[:, cols]), ("F", self.F))
        )

    @classmethod
    def from_rows(
        cls,
        batch: ProbeBatch,
        gate_set: GateSet,
        estimator: str,
        row_logp: torch.Tensor,
        row_dlogp: torch.Tensor,
        row_F: torch.Tensor,  # noqa: N803 - SPEC symbol
        dl_dg: torch.Tensor | None = None,
        measured: tuple[int, ...] | None = None,
        routing: RoutingCount | None = None,
    ) -> ControlResult:
        """The result of per-sample CPU float64 rows ``[B]``, ``[B, K]``, ``[B, K]``: l_m, F
        (and dl_m/dg unless an estimator measured it per family) are the family means."""
        return cls(
            batch.families,
            gate_set,
            family_mean(row_logp, batch).numpy(),
            (family_mean(row_dlogp, batch) if dl_dg is None else dl_dg).numpy(),
            family_mean(row_F, batch).numpy(),
            estimator,
            batch.row_family.cpu().numpy(),
            row_logp.numpy(),
            row_dlogp.numpy(),
            row_F.numpy(),
            measured,
            routing,
        )

    @property
    def dropped(self) -> list[str]:
        """Families whose |l_m| < eps0 (not normalisable, excluded from C)."""
        return [f for f, v in zip(self.families, self.ell, strict=True) if abs(v) < EPS0]

    @property
    def kept(self) -> np.ndarray:
        return np.abs(self.ell) >= EPS0

    @property
    def C(self) -> np.ndarray:  # noqa: N802 - SPEC symbol
        """``[M, K]`` control matrix; rows of dropped families are NaN."""
        C = np.full_like(self.dl_dg, np.nan)
        C[self.kept] = self.dl_dg[self.kept] / self.ell[self.kept, None]
        return C

    def C_kept(self) -> np.ndarray:  # noqa: N802
        return self.C[self.kept]

    def kept_samples(self) -> list[FamilySamples]:
        """The kept families' per-sample quantities (their rows' log pi, d log pi / dg, F), in
        family order: what the noise-corrected measures read (``analysis.uncertainty``)."""
        if self.row_logp is None or self.row_dlogp is None or self.row_F is None:
            raise CdscopeError(f"the {self.estimator} estimator keeps no per-sample rows")
        rows = [np.flatnonzero(self.row_family == m) for m in np.flatnonzero(self.kept)]
        return [FamilySamples(self.row_logp[r], self.row_dlogp[r], self.row_F[r]) for r in rows]


@contextmanager
def frozen_parameters(model: nn.Module) -> Iterator[None]:
    """Turn off parameter gradients inside the block (restored afterwards)."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def control_autograd(
    gm: GatedModel,
    batch: ProbeBatch,
    batch_size: int | None = None,
    routing: RoutingHold | None = None,
) -> ControlResult:
    """C, F and l_m from one forward + one backward per micro-batch (SPEC §2); ``routing``
    records the experts each token takes (for perturbed forwards that follow)."""
    model, K = gm.model, gm.gate_set.K
    device = execution_device(model)
    weights = 1.0 / batch.family_sizes().double()[batch.row_family]  # 1/n_m per row
    row_logp = torch.zeros(batch.B, dtype=torch.float64)
    row_grad = torch.zeros(batch.B, K, dtype=torch.float64)
    row_F = torch.zeros(batch.B, K, dtype=torch.float64)
    dtype = gate_dtype(next(model.parameters()).dtype)
    with frozen_parameters(model):
        for rows in row_chunks(batch.B, batch_size, batch.lengths):
            gates = torch.ones(len(rows), K, device=device, dtype=dtype, requires_grad=True)
            nominal = routing.nominal(batch, rows) if routing else nullcontext()
            with gm.gating(gates, capture_norms=True) as capture, nominal:
                logp = row_target_logprobs(model, batch, rows)
                objective = (logp.double() * weights[rows].to(logp.device)).sum()
                # inside the block: activation checkpointing reruns the forward here
                grad = gate_gradient(objective, gates)
            row_logp[rows] = logp.detach().double().cpu()
            row_grad[rows] = grad.double().cpu()
            row_F[rows] = (
                mean_at_predicting_positions(capture.stacked(K), batch, rows).double().cpu()
            )
    dl_dg = torch.zeros(batch.M, K, dtype=torch.float64).index_add_(0, batch.row_family, row_grad)
    row_dlogp = row_grad / weights[:, None]  # undo the 1/n_m weight: d log pi_b / d g
    return ControlResult.from_rows(
        batch, gm.gate_set, "autograd", row_logp, row_dlogp, row_F, dl_dg=dl_dg
    )


@torch.no_grad()
def _gated_row_logprobs(
    gm: GatedModel,
    batch: ProbeBatch,
    gates: torch.Tensor,
    batch_size: int | None,
    routing: RoutingHold,
) -> torch.Tensor:
    """log pi(y*|x; g) for every (virtual) row: ``gates`` is ``[P*B, K]`` for P settings,
    each row's expert routing held at its nominal choice."""
    B = batch.B  # noqa: N806
    device = execution_device(gm.model)
    out = torch.zeros(gates.shape[0], dtype=torch.float64)
    for virtual in row_chunks(
        gates.shape[0], batch_size, batch.lengths.repeat(gates.shape[0] // B)
    ):
        rows = virtual % B
        with gm.gating(gates[virtual].to(device)), routing.perturbed(batch, rows):
            out[virtual] = row_target_logprobs(gm.model, batch, rows).double().cpu()
    return out


@torch.no_grad()
def record_routing(
    gm: GatedModel, batch: ProbeBatch, routing: RoutingHold, batch_size: int | None = None
) -> None:
    """A g = 1 forward of every row that only records each token's experts in ``routing``
    (a caller handed over its measurement at this theta; ``cdscope.core.routing``)."""
    for rows in row_chunks(batch.B, batch_size, batch.lengths):
        with gm.gating(None), routing.nominal(batch, rows):
            row_target_logprobs(gm.model, batch, rows)


#: central-difference stencils: order -> (offsets in units of h, weights); f' ~ sum w f(o h) / h
STENCILS = {
    2: ((1.0, -1.0), (0.5, -0.5)),
    4: ((1.0, -1.0, 2.0, -2.0), (8 / 12, -8 / 12, -1 / 12, 1 / 12)),
}


def control_finite_difference(
    gm: GatedModel,
    batch: ProbeBatch,
    step: float = 1e-2,
    batch_size: int | None = None,
    order: int = 2,
    gates: Sequence[int] | None = None,
) -> ControlResult:
    """The slow, obviously-correct twin: central differences of l_m over gate k, no backward.

    order 2: dl_m/dg_k ~ (l_m(1 + h e_k) - l_m(1 - h e_k)) / 2h, error O(h^2), 2K passes.
    order 4: (8[l(h) - l(-h)] - [l(2h) - l(-2h)]) / 12h, error O(h^4), 4K passes.
    Runs in the model's dtype — load it in float64 for an exact check. The default step
    is 1e-2, not smaller: several architectures (Llama RMSNorm, rotary tables) compute
    internally in fp32 even for float64 models, so rounding noise ~1e-7 / h overtakes the
    O(h^2) truncation error below h ~ 1e-2 (measured: rel. error 4e-5 at 1e-2, 2.6e-4
    at 1e-3 on a tiny float64 Llama). ``gates`` restricts the differences to a subset of
    gate columns (the others are NaN) for a cheap spot check.

    MoE models: the g = 1 forward (l_m and F) runs first and records each token's experts;
    the perturbed forwards hold them (``cdscope.core.routing``; counts in ``routing``).
    Routing this cannot hold (a router without top-k whose choice the steps changed) is
    refused with one line: those differences would cross routing switches.
    """
    if order not in STENCILS:
        raise ValueError(f"order must be one of {sorted(STENCILS)}, got {order}")
    offsets, weights = STENCILS[order]
    K, B = gm.gate_set.K, batch.B  # noqa: N806
    dtype = gate_dtype(next(gm.model.parameters()).dtype)
    device = execution_device(gm.model)
    with RoutingHold(gm.model, batch, gm.architecture) as routing:
        # l_m and F at g = 1 from one plain gated forward (it records the routing).
        row_logp = torch.zeros(B, dtype=torch.float64)
        row_F = torch.zeros(B, K, dtype=torch.float64)
        with torch.no_grad():
            for rows in row_chunks(B, batch_size, batch.lengths):
                ones = torch.ones(len(rows), K, device=device, dtype=dtype)
                with gm.gating(ones, capture_norms=True) as cap, routing.nominal(batch, rows):
                    row_logp[rows] = row_target_logprobs(gm.model, batch, rows).double().cpu()
                row_F[rows] = (
                    mean_at_predicting_positions(cap.stacked(K), batch, rows).double().cpu()
                )
        columns = (
            torch.arange(K) if gates is None else torch.as_tensor(list(gates), dtype=torch.long)
        )
        P, J = len(offsets), len(columns)  # noqa: N806
        settings = torch.ones(P, J, K, dtype=dtype)  # [offset, perturbed gate, gate]
        for p, offset in enumerate(offsets):
            settings[p, torch.arange(J), columns] += offset * step
        # setting s, row b at s*B + b
        virtual = settings.reshape(P * J, K).repeat_interleave(B, dim=0)
        logp = _gated_row_logprobs(gm, batch, virtual, batch_size, routing).view(P * J, B)
    if routing.count.unheld:
        raise CdscopeError(
            f"cannot hold the expert routing of this {gm.architecture.model_type} model (its "
            f"router picks experts without torch.topk): the fd steps changed "
            f"{routing.count.unheld} of {routing.count.decisions} routing decisions, so the "
            "differences cross routing switches; use --estimator autograd"
        )
    ell = torch.stack([family_mean(logp[s], batch) for s in range(P * J)]).view(P, J, -1)
    dl_dg = torch.full((batch.M, K), float("nan"), dtype=torch.float64)
    dl_dg[:, columns] = (sum(w * ell[p] for p, w in enumerate(weights)) / step).T  # [M, J]
    per_row = logp.view(P, J, B)
    row_dlogp = torch.full((B, K), float("nan"), dtype=torch.float64)
    row_dlogp[:, columns] = (sum(w * per_row[p] for p, w in enumerate(weights)) / step).T
    measured = None if gates is None else tuple(int(k) for k in columns)
    return ControlResult.from_rows(
        batch, gm.gate_set, "fd", row_logp, row_dlogp, row_F, dl_dg=dl_dg, measured=measured,
        routing=routing.count if routing else None,
    )  # fmt: skip
