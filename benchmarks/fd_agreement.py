"""Autograd C vs the finite-difference twin on the embedded model (issue 2, "done when").

    .venv/bin/python benchmarks/fd_agreement.py --dtype float64 --seed 0 --n 3

Prints the relative Frobenius error ||C_autograd - C_fd|| / ||C_fd|| and the wall time
of each estimator, both measured in this process on the same probe.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--step", type=float, default=1e-2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--order", type=int, default=2, choices=[2, 4])
    parser.add_argument("--gates", help="comma-separated gate columns to check (default: all K)")
    args = parser.parse_args()

    from cdscope.core.batch import encode_probe
    from cdscope.core.control import control_autograd, control_finite_difference
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.models import load_model
    from cdscope.core.probes import draw_probe, load_pool

    loaded = load_model(dtype=args.dtype)
    batch = encode_probe(draw_probe(load_pool(), args.seed, args.n), loaded.tokenizer)
    columns = [int(g) for g in args.gates.split(",")] if args.gates else None
    with GatedModel(loaded.model) as gm:
        start = time.perf_counter()
        fast = control_autograd(gm, batch, batch_size=1)
        t_fast = time.perf_counter() - start
        start = time.perf_counter()
        slow = control_finite_difference(
            gm, batch, step=args.step, batch_size=args.batch_size, order=args.order, gates=columns
        )
        t_slow = time.perf_counter() - start
    keep = columns if columns is not None else slice(None)
    a, f = fast.C[:, keep], slow.C[:, keep]
    rel = np.linalg.norm(a - f) / np.linalg.norm(f)
    print(
        f"embedded model, {args.dtype}, seed {args.seed}, n {args.n} ({batch.B} sequences), K {gm.gate_set.K}"
    )
    checked = len(columns) if columns is not None else gm.gate_set.K
    print(
        f"autograd: {t_fast:.1f} s   fd (order {args.order}, {args.order * checked} gated passes over "
        f"{checked} gates, h = {args.step}): {t_slow:.1f} s"
    )
    print(f"relative Frobenius error of C: {rel:.2e}   (target <= 1e-3)")
    print(f"max |l_m difference|: {np.abs(fast.ell - slow.ell).max():.2e}")


if __name__ == "__main__":
    main()
