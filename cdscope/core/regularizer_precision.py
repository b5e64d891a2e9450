"""Precision guards of the proxy regulariser gradients (SPEC §5: in bf16 a gate step below
~0.008 is rounded away).

The gate hooks multiply each write by its gate in the model's dtype, so a perturbed
forward sees (1 + o Ŵ_mk) rounded to that dtype: these checks refuse, with the way out,
steps the dtype cannot carry.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cdscope.errors import CdscopeError


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
