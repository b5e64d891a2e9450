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

and takes one ordinary backward (any attention kernel). Error O(eps^2). The
``richardson`` variant combines eps and eps/2, (4 D(eps/2) - D(eps)) / 3, cancelling
the eps^2 term (error O(eps^4)) for two more gated forwards.

Details as SPEC §5: the nominal l_m in the normaliser stays differentiable unless
``detach_normaliser``; families with ||W_m|| < 1e-12 are skipped; |l_m| < eps0 uses
1 / (l_m + eps0 sign(l_m)). C̄ and l_m come from ``control_autograd`` (frozen
parameters, one gate backward) or from the caller's measurement at the same theta; the
perturbed rows carry per-row gates (family m's rows 1 ± eps Ŵ_m, all families in the
same forward) and go through forward + parameter backward in chunks of ``batch_size``
rows (default B: one perturbation setting per chunk; 2B or 4B puts every setting in one
forward, same result, more memory); the normaliser term is one more nominal forward +
parameter backward. The proxy costs 2B (Richardson: 4B) perturbed rows and B nominal
rows of forward + parameter backward, plus the measurement pass when not handed over;
no graph outlives its chunk. The gates a perturbed forward applies are checked in the
model's dtype (``check_realised_perturbation``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cdscope.batch import ProbeBatch, row_chunks
from cdscope.control import EPS0, ControlResult, control_autograd
from cdscope.errors import CdscopeError
from cdscope.gates import GatedModel
from cdscope.likelihood import row_target_logprobs
from cdscope.models.placement import execution_device
from cdscope.spectral import moment_ratio_torch, r_sensitivity_torch

W_FLOOR = 1e-12
ESTIMATORS = ("exact", "proxy", "richardson")
#: The default first-order estimator, chosen from the measured fidelity table (docs/gradcheck.md).
DEFAULT_ESTIMATOR = "richardson"
DEFAULT_EPS = 0.01


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


def _grads(
    output: torch.Tensor, params: list[nn.Parameter], retain: bool = False
) -> list[torch.Tensor]:
    grads = torch.autograd.grad(output, params, allow_unused=True, retain_graph=retain)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)]


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
    dtype = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
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
    grads = [torch.zeros_like(p) for p in chosen]
    try:
        for rows in row_chunks(batch.B, batch_size, batch.lengths):
            gates = torch.ones(
                len(rows), gm.gate_set.K, device=device, dtype=dtype, requires_grad=True
            )
            with gm.gating(gates):
                logp = row_target_logprobs(model, batch, rows).to(dtype)
            (gate_grad,) = torch.autograd.grad(logp.sum(), gates, create_graph=True)
            rows_on = rows.to(device)
            bracket = (row_W[rows_on] * gate_grad).sum() - (row_c[rows_on] * logp).sum()
            for acc, g in zip(grads, _grads(bracket, chosen), strict=True):
                acc.add_(g)
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
        grads,
        float(moment_ratio_torch(C)),
        C.numpy(),
        families,
        "exact",
        None,
        time.perf_counter() - start,
    )


def check_step_resolution(eps: float, dtype: torch.dtype, richardson: bool) -> None:
    """Refuse a step ``eps`` the model's dtype cannot resolve at g = 1 at all (bf16: spacing 2^-7).

    A necessary condition, cheap enough to check before a run starts; ``proxy_grad``
    then checks the per-gate steps eps * Ŵ_mk it actually applies
    (``check_realised_perturbation``), which are smaller.
    """
    smallest = eps / 2 if richardson else eps
    resolution = torch.finfo(dtype).eps  # spacing of representable numbers just above 1
    if smallest < 2 * resolution:
        raise CdscopeError(
            f"gate step {smallest:g} is below what {str(dtype).removeprefix('torch.')} resolves at g = 1 "
            f"(spacing {resolution:g}): the perturbation would be rounded away. Load the model with "
            f"--dtype float32, or use eps >= {2 * resolution * (2 if richardson else 1):g}"
        )


#: largest relative L2 change of a gate perturbation o * Ŵ_m by the cast to the model dtype
PERTURBATION_TOLERANCE = 0.01


def check_realised_perturbation(
    offsets: Sequence[float], direction: torch.Tensor, dtype: torch.dtype
) -> float:
    """Refuse when casting the gates 1 + o Ŵ_m to ``dtype`` changes the perturbation.

    The gate hooks multiply each write by the gate in the model's dtype, so the step the
    forward sees is (1 + o Ŵ_m) rounded to ``dtype``, minus 1. Each entry of Ŵ_m is a
    fraction of o (about 1/sqrt(K) of it), so in bf16 most of them round to 0 or to the
    spacing 2^-7 even for eps = 0.05. Returns the worst relative L2 error over offsets and
    families; above ``PERTURBATION_TOLERANCE`` the difference quotient would measure a
    different direction, so the gradient is refused with the way out.
    """
    rows = direction[direction.norm(dim=1) > 0].double()
    if rows.numel() == 0:
        return 0.0
    intended = torch.tensor(offsets, dtype=torch.float64, device=rows.device)[:, None, None] * rows
    realised = (1.0 + intended).to(dtype).double() - 1.0
    error = float(((realised - intended).norm(dim=-1) / intended.norm(dim=-1)).max())
    if error > PERTURBATION_TOLERANCE:
        name = str(dtype).removeprefix("torch.")
        raise CdscopeError(
            f"in {name} the gate perturbations eps * Ŵ (smallest offset {min(map(abs, offsets)):g}, "
            f"largest per-gate step {float(intended.abs().max()):.3g}) change by {100 * error:.0f}% "
            f"when the gates are cast to {name}: the proxy would difference along another "
            f"direction. Load the model with --dtype float32 (or use --estimator exact)"
        )
    return error


def proxy_grad(
    gm: GatedModel,
    batch: ProbeBatch,
    eps: float = 0.05,
    params: Sequence[nn.Parameter] | None = None,
    detach_normaliser: bool = False,
    richardson: bool = False,
    batch_size: int | None = None,
    nominal: ControlResult | None = None,
) -> GradResult:
    """First-order proxy of grad_theta R(C(theta)) (SPEC §5): no second-order autodiff.

    L_proxy = sum_m a_m N_m D_m with a_m = ||W_m||, N_m = 1 / l_m (nominal) and
    D_m = sum_o c_o l_m(1 + o Ŵ_m) the difference quotient (c_o its stencil weights).
    Its gradient splits into per-row terms with forward-only coefficients,

        grad L = sum_{m, o, b in m} (a_m N_m c_o / n_m) grad log pi_b(o)  +  sum_m a_m D_m grad N_m,

    so the perturbed rows are pushed through forward + backward ``batch_size`` rows at a
    time (bounded memory; rows of similar length share a chunk), and the normaliser term,
    linear in the nominal rows' log pi once every D_m is known, is one more nominal
    forward + backward per chunk. C̄ and l_m come from ``control_autograd`` (frozen
    parameters) or from ``nominal``, the caller's measurement at the same theta. No graph
    outlives its chunk: peak memory is one chunk's forward + backward.
    """
    if eps <= 0:
        raise ValueError(f"eps must be positive, got {eps}")
    start = time.perf_counter()
    model = gm.model
    chosen = trainable(model, params)
    model_dtype = next(model.parameters()).dtype
    check_step_resolution(eps, model_dtype, richardson)
    device = execution_device(model)
    dtype = torch.float64 if model_dtype == torch.float64 else torch.float32
    K, B = gm.gate_set.K, batch.B  # noqa: N806
    # stencil: offsets o and weights c_o with D = sum_o c_o l(1 + o Ŵ)
    if richardson:  # (4 D(eps/2) - D(eps)) / 3
        offsets = (eps, -eps, eps / 2, -eps / 2)
        stencil = (-1 / (6 * eps), 1 / (6 * eps), 4 / (3 * eps), -4 / (3 * eps))
    else:
        offsets, stencil = (eps, -eps), (1 / (2 * eps), -1 / (2 * eps))
    sizes = batch.family_sizes().to(device=device, dtype=dtype)
    row_family = batch.row_family.to(device)

    # 1. C̄ and l_m at g = 1 (frozen parameters, one gate backward), unless the caller
    #    already measured them at this theta.
    nominal = nominal or control_autograd(gm, batch, batch_size)
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

    # 2. Perturbed rows: family m's rows carry gates 1 + o Ŵ_m; backward chunk by chunk.
    grads = [torch.zeros_like(p) for p in chosen]

    def backpropagate(
        rows: torch.Tensor, gates: torch.Tensor | None, coefficient: torch.Tensor
    ) -> torch.Tensor:
        """grads += grad of sum_b coefficient_b log pi_b (``gates`` None: g = 1); log pi."""
        with gm.gating(gates):
            logp = row_target_logprobs(model, batch, rows).to(dtype)
        for acc, g in zip(grads, _grads((coefficient * logp).sum(), chosen), strict=True):
            acc.add_(g)
        return logp.detach()

    virtual = torch.arange(len(offsets) * B)  # offset index = v // B, batch row = v % B
    offset_of = torch.tensor(offsets, dtype=dtype, device=device)[virtual // B]
    weight_of = torch.tensor(stencil, dtype=dtype, device=device)[virtual // B]
    rows_of = virtual % B
    logp_all = torch.zeros(len(virtual), dtype=dtype, device=device)
    for chunk in row_chunks(len(virtual), batch_size or B, batch.lengths.repeat(len(offsets))):
        rows = rows_of[chunk]
        family = row_family[rows.to(device)]
        gates = 1.0 + offset_of[chunk, None] * direction[family]
        coefficient = amplitude[family] * weight_of[chunk] / sizes[family]
        logp_all[chunk] = backpropagate(rows, gates, coefficient)

    # 3. The normaliser term, once every D_m is known: sum_m a_m D_m grad N_m with
    #    grad N_m = -N_m^2 grad l_m and l_m the mean of its rows' log pi, so it is one more
    #    nominal forward + backward per chunk with per-row coefficients (no graph kept).
    per_row = (weight_of * logp_all).view(len(offsets), B).sum(0)  # sum_o c_o log pi_b(o)
    derivative = _family_sum(per_row, batch) / sizes  # D_m
    if not detach_normaliser:
        per_family = -w_norm * derivative * inverse**2  # d(a_m D_m N_m)/d l_m
        for rows in row_chunks(B, batch_size, batch.lengths):
            family = row_family[rows.to(device)]
            backpropagate(rows, None, per_family[family] / sizes[family])
    families = [f for f, k in zip(batch.families, nominal.kept.tolist(), strict=True) if k]
    R = float(moment_ratio_torch(C_bar.double()))  # noqa: N806
    return GradResult(
        grads,
        R,
        C_bar.double().cpu().numpy(),
        families,
        "richardson" if richardson else "proxy",
        eps,
        time.perf_counter() - start,
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
    """Dispatch by estimator name: exact | proxy | richardson.

    ``nominal``: ``control_autograd`` of ``batch`` at the current theta, when the caller
    has it (it is the first pass of every estimator).
    """
    if estimator == "exact":
        return exact_grad(gm, batch, params, batch_size, nominal)
    if estimator in ("proxy", "richardson"):
        return proxy_grad(
            gm, batch, eps, params, detach_normaliser, estimator == "richardson", batch_size,
            nominal,
        )  # fmt: skip
    raise CdscopeError(
        f"gradient estimator must be one of {', '.join(ESTIMATORS)}; got {estimator!r}"
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
