"""Wall time and peak memory of the regulariser-gradient estimators (issue 4).

Each mode runs in its own process (so peak RSS is that mode's alone) on the embedded
model and the seed-0 probe (3 families x n = 3 = 9 sequences), fp32, eager attention:

- plain:      one forward + backward of the probe log-likelihood with parameter grads
- exact:      d R(C(theta)) / d theta by double backward (chunked: C first, then one
              create_graph pass per row chunk)
- proxy:      fixed-step first-order proxy (eps = 0.05, the SPEC reference)
- richardson: the default estimator (Richardson over eps and eps/2)
- proxy-handed, richardson-handed: the same with the measurement pass (C̄, l_m from
              ``control_autograd``) handed over, as in training, where the loop has
              already measured the probe at that theta (timed: the rest only)

    .venv/bin/python benchmarks/bench_regularizer.py [--reps 3] [--batch-size 1]

Every mode runs ``--batch-size`` rows per forward (default 1, the CPU default: no
padding). Prints the median wall time over reps (after one warm-up), whole-process peak RSS and
the time ratio to plain, all measured in one run.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

MODES = ("plain", "exact", "proxy", "richardson", "proxy-handed", "richardson-handed")


def run_mode(mode: str, reps: int, batch_size: int) -> dict:
    import torch

    from cdscope.batch import encode_probe, row_chunks
    from cdscope.control import control_autograd
    from cdscope.gates import GatedModel
    from cdscope.likelihood import row_target_logprobs
    from cdscope.models import load_model
    from cdscope.probes import draw_probe, load_pool
    from cdscope.regularizer import DEFAULT_EPS, exact_grad, proxy_grad

    loaded = load_model(attn="eager")
    batch = encode_probe(draw_probe(load_pool(), 0, 3), loaded.tokenizer)
    model = loaded.model
    params = [p for p in model.parameters() if p.requires_grad]

    def plain() -> None:
        for rows in row_chunks(batch.B, batch_size, batch.lengths):
            logp = row_target_logprobs(model, batch, rows)
            torch.autograd.grad(logp.sum(), params)

    with GatedModel(model) as gm:
        nominal = control_autograd(gm, batch, batch_size) if mode.endswith("-handed") else None
        step = {
            "plain": plain,
            "exact": lambda: exact_grad(gm, batch, batch_size=batch_size),
            "proxy": lambda: proxy_grad(gm, batch, eps=0.05, batch_size=batch_size),
            "richardson": lambda: proxy_grad(
                gm, batch, eps=DEFAULT_EPS, richardson=True, batch_size=batch_size
            ),
            "proxy-handed": lambda: proxy_grad(
                gm, batch, eps=0.05, batch_size=batch_size, nominal=nominal
            ),
            "richardson-handed": lambda: proxy_grad(
                gm, batch, eps=DEFAULT_EPS, richardson=True, batch_size=batch_size, nominal=nominal
            ),
        }[mode]
        step()
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"mode": mode, "seconds": statistics.median(times), "peak_gb": peak_kb / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1, help="rows per forward")
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.reps, args.batch_size)))
        return
    results = {}
    for mode in MODES:
        output = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--reps", str(args.reps)]
            + ["--batch-size", str(args.batch_size)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        results[mode] = json.loads(output.strip().splitlines()[-1])
    plain = results["plain"]["seconds"]
    print(f"{'mode':<18} {'median s':>9} {'x plain':>8} {'peak RSS GB':>12}")
    for mode in MODES:
        r = results[mode]
        print(f"{mode:<18} {r['seconds']:>9.2f} {r['seconds'] / plain:>8.2f} {r['peak_gb']:>12.2f}")


if __name__ == "__main__":
    main()
