"""C estimation vs one no-grad forward on the embedded model's 9-sequence probe (issue 2).

Prints medians of R repetitions measured in one process and their ratio (the target:
C estimation <= 2.3 x one no-grad forward over the same padded batch), plus the cached
load time of the embedded model.

    .venv/bin/python benchmarks/bench_control.py [--reps 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def median_time(fn, reps: int) -> float:  # noqa: ANN001
    fn()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--template", default="plain")
    args = parser.parse_args()

    from cdscope.core.batch import encode_probe
    from cdscope.core.control import control_autograd
    from cdscope.core.gating.model import GatedModel
    from cdscope.core.models import load_model
    from cdscope.core.probes import draw_probe, load_pool

    load_model()  # make sure the cache exists
    start = time.perf_counter()
    loaded = load_model()
    load_s = time.perf_counter() - start

    items = draw_probe(load_pool(), args.seed, 3)
    batch = encode_probe(items, loaded.tokenizer, args.template)
    model = loaded.model

    @torch.no_grad()
    def plain_forward() -> None:
        model(input_ids=batch.input_ids, use_cache=False)

    with GatedModel(model) as gm:
        t_fwd = median_time(plain_forward, args.reps)
        t_c = median_time(lambda: control_autograd(gm, batch), args.reps)
        t_rows = median_time(lambda: control_autograd(gm, batch, batch_size=1), args.reps)

    tokens = int(batch.lengths.sum())
    print(
        f"probe: {batch.B} sequences, padded width {batch.input_ids.shape[1]}, {tokens} real tokens, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"cached load of the embedded model: {load_s:.2f} s (in-process, after imports)")
    print(f"no-grad forward (full logits):     {t_fwd:.3f} s  (median of {args.reps})")
    print(
        f"C + F, one padded batch:           {t_c:.3f} s  (median of {args.reps})  "
        f"ratio {t_c / t_fwd:.2f} x   (target <= 2.3)"
    )
    print(f"C + F, one row per forward (CPU default): {t_rows:.3f} s  ratio {t_rows / t_fwd:.2f} x")


if __name__ == "__main__":
    main()
