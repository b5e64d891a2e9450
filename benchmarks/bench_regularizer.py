"""Wall time and peak memory of the regulariser-gradient estimators, in units of one plain
probe forward + backward (issues 4 and 16).

Every timing runs in a fresh process (so peak RSS is that mode's alone) on the embedded
model and the seed-0 probe (3 families x n = 3 = 9 sequences), fp32, eager attention,
after a one-row forward + backward warm-up. Repeats are interleaved — round r runs every
mode once, in order — so drift of a shared machine hits every mode alike; the table gives
the median over rounds and its ratio to the plain median.

- plain:      one forward + backward of the probe log-likelihood with parameter grads
- exact:      d R(C(theta)) / d theta by double backward (chunked: C first, then one
              create_graph pass per row chunk)
- proxy:      fixed-step first-order proxy (eps = 0.05, the SPEC reference)
- richardson: Richardson over eps and eps/2 (eps = DEFAULT_EPS)
- folded:     the proxy with its normaliser folded into the perturbed passes (DEFAULT_EPS)
- *-handed:   the same with the measurement pass (C̄, l_m from ``control_autograd``)
              handed over, as in training, where the loop has already measured the probe
              at that theta (timed: the rest only)

    .venv/bin/python benchmarks/bench_regularizer.py [--reps 3] [--batch-size 1] [--modes plain,folded]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

MODES = (
    "plain", "exact", "proxy", "richardson", "folded",
    "proxy-handed", "richardson-handed", "folded-handed",
)  # fmt: skip
#: the SPEC's reference gate step, for the ``proxy`` modes
SPEC_EPS = 0.05


def run_mode(mode: str, batch_size: int) -> dict:
    import torch

    from cdscope.core.batch import encode_probe, row_chunks
    from cdscope.core.control import control_autograd
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.likelihood import row_target_logprobs
    from cdscope.core.models import load_model
    from cdscope.core.probes import draw_probe, load_pool
    from cdscope.core.regularizer import DEFAULT_EPS, exact_grad, regularizer_grad

    loaded = load_model(attn="eager")
    batch = encode_probe(draw_probe(load_pool(), 0, 3), loaded.tokenizer)
    model = loaded.model
    params = [p for p in model.parameters() if p.requires_grad]

    def plain(chunks: list[torch.Tensor]) -> None:
        for rows in chunks:
            torch.autograd.grad(row_target_logprobs(model, batch, rows).sum(), params)

    estimator = mode.removesuffix("-handed")
    eps = SPEC_EPS if estimator == "proxy" else DEFAULT_EPS
    with GatedModel(model) as gm:
        plain([torch.arange(1)])  # warm-up: allocator and thread pool, one row
        nominal = control_autograd(gm, batch, batch_size) if mode.endswith("-handed") else None
        start = time.perf_counter()
        if mode == "plain":
            plain(list(row_chunks(batch.B, batch_size, batch.lengths)))
        elif mode == "exact":
            exact_grad(gm, batch, batch_size=batch_size)
        else:
            regularizer_grad(gm, batch, estimator, eps, batch_size=batch_size, nominal=nominal)
        seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "seconds": seconds, "peak_gb": peak_kb / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--batch-size", type=int, default=1, help="rows per forward")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.batch_size)))
        return
    modes = [m for m in MODES if m in args.modes.split(",")]
    if "plain" not in modes:
        parser.error("--modes must include plain (the unit of the ratios)")
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for round_ in range(args.reps):
        for mode in modes:
            output = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--batch-size", str(args.batch_size)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[mode].append(json.loads(output.strip().splitlines()[-1]))
            print(f"round {round_ + 1}: {mode} {runs[mode][-1]['seconds']:.2f} s", file=sys.stderr)
    plain = statistics.median(r["seconds"] for r in runs["plain"])
    print(f"{'mode':<18} {'median s':>9} {'x plain':>8} {'range x plain':>14} {'peak RSS GB':>12}")
    for mode in modes:
        seconds = [r["seconds"] for r in runs[mode]]
        median = statistics.median(seconds)
        spread = f"{min(seconds) / plain:.2f}-{max(seconds) / plain:.2f}"
        peak = max(r["peak_gb"] for r in runs[mode])
        print(f"{mode:<18} {median:>9.2f} {median / plain:>8.2f} {spread:>14} {peak:>12.2f}")


if __name__ == "__main__":
    main()
