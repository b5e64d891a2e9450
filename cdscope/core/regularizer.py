"""The CD-RFT regulariser's parameter gradient, d R(C(theta)) / d theta (SPEC §5).

R = tr(G^2) / tr(G)^2 with G = C C^T is the smooth stand-in for B_shared, and
C[m, k] = (1 / l_m) d l_m / d g_k at g = 1. Two ways to its theta-gradient:

**Exact** (``exact_grad``): build C with the gate-gradient graph kept
(``create_graph=True``) and backpropagate R — second-order autodiff. Needs an attention
kernel with a double backward (eager); used as ground truth.

**First-order proxy** (``proxy_grad``): with W = dR/dC at a stop-gradient C̄
(``spectral.r_sensitivity_torch``) and Ŵ_m = W_m / ||W_m||,

    sum_k W_mk C_mk = (||W_m|| / l_m) * D_m,    D_m = d/dt l_m(1 + t Ŵ_m) at t = 0,

so with W held fixed, grad_theta sum_mk W_mk C_mk = grad_theta R. The proxy replaces
the directional derivative D_m by a central difference of two gated forwards,

    L_proxy = sum_m (||W_m|| / l_m) * (l_m(1 + eps Ŵ_m) - l_m(1 - eps Ŵ_m)) / (2 eps),

and takes one ordinary backward (any attention kernel). Error O(eps^2). ``richardson``
combines eps and eps/2, (4 D(eps/2) - D(eps)) / 3 (error O(eps^4), two more gated
forwards). ``folded`` takes D_m in the normaliser term from the measured C̄ (exact) and
folds grad l_m(1) into the two perturbed passes (see ``proxy_grad``): 2B rows of forward
+ parameter backward instead of 3B, still O(eps^2).

Details as SPEC §5: the nominal l_m in the normaliser stays differentiable unless
``detach_normaliser``; families with ||W_m|| < 1e-12 are skipped; |l_m| < eps0 uses
1 / (l_m + eps0 sign(l_m)). C̄ and l_m come from ``control_autograd`` or from the
caller's measurement at the same theta (``nominal``: training hands it over). Rows go
through forward + parameter backward in chunks of ``batch_size``; no graph outlives its
chunk. The gates a perturbed forward applies are checked in the model's dtype
(``check_realised_perturbation``). On MoE models the perturbed forwards keep each token's
experts of the nominal forward (``cdscope.core.routing``): the exact gradient treats the
top-k indices as constants, and a perturbation that crossed a routing switch would
difference two branches (tiny float64 DeepSeek-V3 at eps = 0.01: cosine 0.14 with the exact
gradient before, 1.000000 held); ``GradResult.routing`` counts the decisions held.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cdscope.analysis.spectral import moment_ratio_torch, r_sensitivity_torch
from cdscope.core.batch import ProbeBatch, row_chunks
from cdscope.core.control import EPS0, ControlResult, control_autograd, record_routing
from cdscope.core.gates.vocabulary import gate_dtype
from cdscope.core.gating.model import GatedModel
from cdscope.core.grad_sink import GradSink, gate_gradient
from cdscope.core.likelihood import row_target_logprobs
from cdscope.core.models.placement import execution_device
from cdscope.core.regularizer_precision import check_realised_perturbation, check_step_resolution
from cdscope.core.routing import RoutingCount, RoutingHold
from cdscope.distributed import held_unsharded
from cdscope.errors import CdscopeError
from cdscope.settings import DEFAULT_EPS, DEFAULT_ESTIMATOR, GRADIENT_ESTIMATORS

W_FLOOR = 1e-12
#: (fold_normaliser, richardson) -> estimator name of a ``proxy_grad`` result
_NAMES = {
    (False, False): "proxy",
    (False, True): "richardson",
    (True, False): "folded",
    (True, True): "folded-richardson",
}


@dataclass
class GradResult:
    """Gradient of R(C(theta)) w.r.t. ``params`` (same order), with the C̄ it was taken at."""

    grads: list[torch.Tensor]
    R: float  # noqa: N815 - SPEC symbol
    C: np.ndarray  # [M_kept, K] at the current theta
    families: list[str]  # kept families
    estimator: str
    eps: float | None
    seconds: float
    #: first-order estimators on an MoE model: the routing decisions the perturbed forwards
    #: held (``unheld``: ones this could not hold, a router without top-k)
    routing: RoutingCount | None = None

    def flat(self) -> torch.Tensor:
        device = self.grads[0].device  # under a device map the weights span devices
        return torch.cat([g.reshape(-1).double().to(device) for g in self.grads])


def trainable(model: nn.Module, params: Sequence[nn.Parameter] | None = None) -> list[nn.Parameter]:
    """The parameters to differentiate: ``params`` or every parameter with requires_grad."""
    chosen = (
        list(params) if params is not None else [p for p in model.parameters() if p.requires_grad]
    )
    if not chosen:
        raise ValueError("no parameters to differentiate (all have requires_grad=False)")
    return chosen


def _family_sum(per_row: torch.Tensor, batch: ProbeBatch) -> torch.Tensor:
    """Differentiable rows [B, ...] -> family sums [M, ...]."""
    out = per_row.new_zeros((batch.M, *per_row.shape[1:]))
    return out.index_add(0, batch.row_family.to(per_row.device), per_row)


def _safe_inverse(ell: torch.Tensor) -> torch.Tensor:
    """1 / l_m, pushed away from zero (sign kept) when |l_m| < eps0 (SPEC §5)."""
    sign = torch.where(ell >= 0, 1.0, -1.0).to(ell)
    return 1.0 / torch.where(ell.abs() < EPS0, ell + EPS0 * sign, ell)


def _double_backward_error(exc: RuntimeError, model: nn.Module) -> CdscopeError:
    attn = getattr(model.config, "_attn_implementation", "unknown")
    return CdscopeError(
        f"the exact gradient needs second-order autodiff through attention, which the {attn!r} "
        f"kernel cannot do ({str(exc).splitlines()[0][:120]}); load the model with --attn eager"
    )


def exact_grad(
    gm: GatedModel,
    batch: ProbeBatch,
    params: Sequence[nn.Parameter] | None = None,
    batch_size: int | None = None,
    nominal: ControlResult | None = None,
) -> GradResult:
    """Ground truth by second-order autodiff, ``batch_size`` rows at a time.

    R depends on theta only through C, so with W = dR/dC taken at the current C (not an
    approximation: the chain rule evaluated at this theta), grad R = sum_mk W_mk grad C_mk.
    With C_mk = S_mk / l_m, S_mk = d l_m / d g_k, and S_m, l_m family means of per-row
    terms, grad C_mk = (grad S_mk - C_mk grad l_m) / l_m, which splits over rows:

        grad R = sum_m sum_{b in m} 1 / (n_m l_m) * grad[ W_m . d log pi_b / d g_b
                                                         - (W_m . C_m) log pi_b ].

    Pass 1 (``control_autograd``, frozen parameters) gives C and l_m; pass 2 runs each
    row chunk forward, takes its gate gradient with ``create_graph`` and backpropagates
    the bracket into ``params`` — the double backward, with memory bounded by the chunk.
    """
    start = time.perf_counter()
    model = gm.model
    chosen = trainable(model, params)
    device = execution_device(model)
    dtype = gate_dtype(next(model.parameters()).dtype)
    nominal = nominal or control_autograd(gm, batch, batch_size)
    kept = torch.from_numpy(nominal.kept)
    C = torch.from_numpy(nominal.C_kept())  # noqa: N806 - [M_kept, K] float64
    W = torch.zeros(batch.M, gm.gate_set.K, dtype=torch.float64)  # noqa: N806
    W[kept] = r_sensitivity_torch(C)
    w_dot_c = torch.zeros(batch.M, dtype=torch.float64)
    w_dot_c[kept] = (W[kept] * C).sum(1)
    ell = torch.from_numpy(nominal.ell)
    scale = torch.where(kept, 1.0 / (batch.family_sizes().double() * ell), 0.0)  # 1/(n_m l_m)
    row_W = (W * scale[:, None])[batch.row_family].to(device=device, dtype=dtype)  # noqa: N806
    row_c = (w_dot_c * scale)[batch.row_family].to(device=device, dtype=dtype)
    try:
        with GradSink(model, chosen, "the exact regulariser gradient") as sink:
            for rows in row_chunks(batch.B, batch_size, batch.lengths):
                gates = torch.ones(
                    len(rows), gm.gate_set.K, device=device, dtype=dtype, requires_grad=True
                )
                # both backward passes inside the block: checkpointing reruns the gated forward
                with gm.gating(gates), held_unsharded(model):
                    logp = row_target_logprobs(model, batch, rows).to(dtype)
                    gate_grad = gate_gradient(logp.sum(), gates, create_graph=True)
                    rows_on = rows.to(device)
                    bracket = (row_W[rows_on] * gate_grad).sum() - (row_c[rows_on] * logp).sum()
                    sink.add(bracket)
    except RuntimeError as exc:
        if (
            "derivative" in str(exc)
            or "double backward" in str(exc)
            or "not implemented" in str(exc)
        ):
            raise _double_backward_error(exc, model) from exc
        raise
    families = [f for f, k in zip(batch.families, nominal.kept.tolist(), strict=True) if k]
    return GradResult(
        sink.grads,
        float(moment_ratio_torch(C)),
        C.numpy(),
        families,
        "exact",
        None,
        time.perf_counter() - start,
    )


def _stencil(
    eps: float, richardson: bool
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """Offsets o, derivative weights c_o and mean weights h_o of the gate-space stencil.

    D = sum_o c_o l(1 + o Ŵ) is the directional derivative and sum_o h_o l(1 + o Ŵ) the
    value at g = 1, both to O(eps^2) (central) or O(eps^4) (Richardson: 4 X(eps/2) - X(eps)
    over 3). The mean weights serve the folded normaliser.
    """
    if not richardson:
        return (eps, -eps), (1 / (2 * eps), -1 / (2 * eps)), (0.5, 0.5)
    offsets = (eps, -eps, eps / 2, -eps / 2)
    return (
        offsets,
        (-1 / (6 * eps), 1 / (6 * eps), 4 / (3 * eps), -4 / (3 * eps)),
        (-1 / 6, -1 / 6, 2 / 3, 2 / 3),
    )


def proxy_grad(
    gm: GatedModel,
    batch: ProbeBatch,
    eps: float = DEFAULT_EPS,
    params: Sequence[nn.Parameter] | None = None,
    detach_normaliser: bool = False,
    richardson: bool = False,
    batch_size: int | None = None,
    nominal: ControlResult | None = None,
    fold_normaliser: bool = False,
) -> GradResult:
    """First-order proxy of grad_theta R(C(theta)) (SPEC §5): no second-order autodiff.

    L_proxy = sum_m a_m N_m D_m with a_m = ||W_m||, N_m = 1 / l_m (nominal) and
    D_m = sum_o c_o l_m(1 + o Ŵ_m) the difference quotient (c_o its stencil weights).
    Its gradient splits into per-row terms with forward-only coefficients,

        grad L = sum_{m, o, b in m} (a_m N_m c_o / n_m) grad log pi_b(o)  +  sum_m a_m D_m grad N_m,

    so the perturbed rows are pushed through forward + backward ``batch_size`` rows at a
    time (bounded memory; rows of similar length share a chunk), and the normaliser term
    grad N_m = -N_m^2 grad l_m(1), linear in the nominal rows' log pi once every D_m is
    known, is one more nominal forward + backward per chunk. C̄ and l_m come from
    ``control_autograd`` (frozen parameters) or from ``nominal``, the caller's measurement
    at the same theta. No graph outlives its chunk.

    ``fold_normaliser`` (the ``folded`` estimator) drops that extra pass: D_m there is
    the exact directional derivative Ŵ_m . S_m = l_m Ŵ_m . C̄_m, already measured, and
    grad l_m(1) = sum_o h_o grad l_m(1 + o Ŵ_m) + O(eps^2) (the stencil's mean weights:
    1/2, 1/2 for the central difference) is a combination of the perturbed rows' own
    gradients. Every perturbed row then carries the coefficient
    (a_m N_m c_o - a_m D_m N_m^2 h_o) / n_m: same O(eps^2) order, 2B rows of forward +
    backward instead of 3B, and the exact gradient's normaliser coefficient
    -(W_m . C_m) / l_m evaluated exactly rather than by difference.
    """
    if eps <= 0:
        raise ValueError(f"eps must be positive, got {eps}")
    start = time.perf_counter()
    model = gm.model
    chosen = trainable(model, params)
    model_dtype = next(model.parameters()).dtype
    check_step_resolution(eps, model_dtype, richardson)
    device = execution_device(model)
    dtype = gate_dtype(model_dtype)
    K, B = gm.gate_set.K, batch.B  # noqa: N806
    offsets, stencil, means = _stencil(eps, richardson)
    sizes = batch.family_sizes().to(device=device, dtype=dtype)
    row_family = batch.row_family.to(device)

    # 1. C̄ and l_m at g = 1 (frozen parameters, one gate backward), unless the caller
    #    already measured them at this theta; on an MoE model the g = 1 forward records
    #    each token's experts, which the perturbed forwards of step 2 hold.
    routing = RoutingHold(model, batch, gm.architecture)
    with routing:
        if nominal is None:
            nominal = control_autograd(gm, batch, batch_size, routing)
        elif routing:
            record_routing(gm, batch, routing, batch_size)
    ell = torch.from_numpy(nominal.ell).to(device=device, dtype=dtype)
    kept = torch.from_numpy(nominal.kept).to(device)
    C_bar = torch.from_numpy(nominal.C_kept()).to(device=device, dtype=dtype)  # noqa: N806
    W = torch.zeros(batch.M, K, device=device, dtype=dtype)  # noqa: N806
    W[kept] = r_sensitivity_torch(C_bar)
    w_norm = W.norm(dim=1)
    active = kept & (w_norm >= W_FLOOR)
    direction = torch.where(active[:, None], W / w_norm.clamp_min(W_FLOOR)[:, None], 0.0)
    inverse = torch.where(active, _safe_inverse(ell), 0.0)  # N_m = 1 / l_m, safeguarded
    amplitude = w_norm * inverse  # a_m N_m
    check_realised_perturbation(offsets, direction, model_dtype)
    folded = fold_normaliser and not detach_normaliser
    if folded:  # -a_m D_m N_m^2 with the measured D_m = l_m Ŵ_m . C̄_m = (W_m . C̄_m) / a_m
        w_dot_c = torch.zeros(batch.M, device=device, dtype=dtype)
        w_dot_c[kept] = (W[kept] * C_bar).sum(1)
        normaliser = -w_dot_c * ell * inverse**2
    else:
        normaliser = torch.zeros(batch.M, device=device, dtype=dtype)

    # 2. Perturbed rows: family m's rows carry gates 1 + o Ŵ_m; backward chunk by chunk.
    sink = GradSink(model, chosen, f"the {_NAMES[folded, richardson]} regulariser gradient")

    def backpropagate(
        rows: torch.Tensor, gates: torch.Tensor | None, coefficient: torch.Tensor
    ) -> torch.Tensor:
        """grads += grad of sum_b coefficient_b log pi_b (``gates`` None: g = 1, its own
        routing; else the nominal routing held); log pi. The backward runs inside the
        gating block: activation checkpointing reruns the gated forward during it."""
        held = nullcontext() if gates is None else routing.perturbed(batch, rows)
        with gm.gating(gates), held:
            logp = row_target_logprobs(model, batch, rows).to(dtype)
            sink.add((coefficient * logp).sum())
        return logp.detach()

    virtual = torch.arange(len(offsets) * B)  # offset index = v // B, batch row = v % B
    offset_of = torch.tensor(offsets, dtype=dtype, device=device)[virtual // B]
    weight_of = torch.tensor(stencil, dtype=dtype, device=device)[virtual // B]
    mean_of = torch.tensor(means, dtype=dtype, device=device)[virtual // B]
    rows_of = virtual % B
    logp_all = torch.zeros(len(virtual), dtype=dtype, device=device)
    with routing, sink:
        chunks = row_chunks(len(virtual), batch_size or B, batch.lengths.repeat(len(offsets)))
        for chunk in chunks:
            rows = rows_of[chunk]
            family = row_family[rows.to(device)]
            gates = 1.0 + offset_of[chunk, None] * direction[family]
            coefficient = amplitude[family] * weight_of[chunk] + normaliser[family] * mean_of[chunk]
            logp_all[chunk] = backpropagate(rows, gates, coefficient / sizes[family])

        # 3. Unfolded normaliser term, once every D_m is known: sum_m a_m D_m grad N_m with
        #    grad N_m = -N_m^2 grad l_m and l_m the mean of its rows' log pi, so it is one more
        #    nominal forward + backward per chunk with per-row coefficients (no graph kept).
        if not detach_normaliser and not folded:
            per_row = (weight_of * logp_all).view(len(offsets), B).sum(0)  # sum_o c_o log pi_b(o)
            derivative = _family_sum(per_row, batch) / sizes  # D_m
            per_family = -w_norm * derivative * inverse**2  # d(a_m D_m N_m)/d l_m
            for rows in row_chunks(B, batch_size, batch.lengths):
                family = row_family[rows.to(device)]
                backpropagate(rows, None, per_family[family] / sizes[family])
    families = [f for f, k in zip(batch.families, nominal.kept.tolist(), strict=True) if k]
    R = float(moment_ratio_torch(C_bar.double()))  # noqa: N806
    return GradResult(
        sink.grads,
        R,
        C_bar.double().cpu().numpy(),
        families,
        _NAMES[folded, richardson],
        eps,
        time.perf_counter() - start,
        routing.count if routing else None,
    )


def regularizer_grad(
    gm: GatedModel,
    batch: ProbeBatch,
    estimator: str = DEFAULT_ESTIMATOR,
    eps: float = DEFAULT_EPS,
    params: Sequence[nn.Parameter] | None = None,
    detach_normaliser: bool = False,
    batch_size: int | None = None,
    nominal: ControlResult | None = None,
) -> GradResult:
    """Dispatch by estimator name: exact | proxy | richardson | folded.

    ``nominal``: ``control_autograd`` of ``batch`` at the current theta, when the caller
    has it (it is the first pass of every estimator).
    """
    if estimator == "exact":
        return exact_grad(gm, batch, params, batch_size, nominal)
    if estimator in ("proxy", "richardson", "folded"):
        return proxy_grad(
            gm, batch, eps, params, detach_normaliser, estimator == "richardson", batch_size,
            nominal, fold_normaliser=estimator == "folded",
        )  # fmt: skip
    raise CdscopeError(
        f"gradient estimator must be one of {', '.join(GRADIENT_ESTIMATORS)}; got {estimator!r}"
    )


def fidelity(approx: GradResult, exact: GradResult | torch.Tensor) -> dict[str, float]:
    """Cosine and relative L2 error of ``approx`` against ``exact`` (flattened).

    ``exact`` may be given already flattened, so a sweep flattens it once.
    """
    a = approx.flat()
    e = exact if isinstance(exact, torch.Tensor) else exact.flat()
    return {
        "cosine": float(torch.dot(a, e) / (a.norm() * e.norm())),
        "rel_error": float((a - e).norm() / e.norm()),
    }
