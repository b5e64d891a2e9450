"""How much of the proxy's gate perturbation eps * Ŵ survives the cast to bf16 (issue 4).

On the embedded model (loaded in bf16, eager attention) and the seed-0 probe (n = 3):
C̄ from one gate backward, W = dR/dC, Ŵ_m = W_m / ||W_m||, then for each eps the
relative L2 change of the perturbation o * Ŵ_m when the gates 1 + o Ŵ_m are rounded to
bf16 (``regularizer.check_realised_perturbation``; above 1 % the proxy refuses).

    .venv/bin/python benchmarks/bf16_gate_steps.py
"""

from __future__ import annotations

import torch

from cdscope.analysis.spectral import r_sensitivity_torch
from cdscope.core.batch import encode_probe
from cdscope.core.control import control_autograd
from cdscope.core.gating.model import GatedModel
from cdscope.core.models import load_model
from cdscope.core.probes import draw_probe, load_pool
from cdscope.core.regularizer import PERTURBATION_TOLERANCE, check_realised_perturbation
from cdscope.errors import CdscopeError


def realised_error(offsets: tuple[float, ...], direction: torch.Tensor, dtype: torch.dtype) -> str:
    try:
        return f"{100 * check_realised_perturbation(offsets, direction, dtype):.1e}% (kept)"
    except CdscopeError as exc:
        return str(exc).split(" change by ")[1].split(" ")[0] + " (refused)"


def main() -> None:
    loaded = load_model(dtype="bfloat16", attn="eager")
    batch = encode_probe(draw_probe(load_pool(), 0, 3), loaded.tokenizer)
    with GatedModel(loaded.model) as gm:
        C = torch.from_numpy(control_autograd(gm, batch, 1).C_kept())  # noqa: N806
    W = r_sensitivity_torch(C)  # noqa: N806
    direction = W / W.norm(dim=1, keepdim=True)
    print(f"K = {direction.shape[1]}; |Ŵ_mk|: median {float(direction.abs().median()):.3f}, "
          f"max {float(direction.abs().max()):.3f}; tolerance {100 * PERTURBATION_TOLERANCE:g}%")  # fmt: skip
    print(f"{'eps':>6} {'proxy, bf16':>18} {'richardson, bf16':>18} {'proxy, fp32':>14}")
    for eps in (0.2, 0.1, 0.05, 0.02, 0.01, 0.005):
        proxy, richardson = (eps, -eps), (eps, -eps, eps / 2, -eps / 2)
        print(f"{eps:>6g} {realised_error(proxy, direction, torch.bfloat16):>18} "
              f"{realised_error(richardson, direction, torch.bfloat16):>18} "
              f"{realised_error(proxy, direction, torch.float32):>14}")  # fmt: skip


if __name__ == "__main__":
    main()
