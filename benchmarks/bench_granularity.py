"""C at head / neuron granularity against sublayer on the embedded model (issue 15).

Time: one process, the model loaded once, the three gate sets built once (their one-off
projection discovery is not timed); then ``--repeats`` rounds, each timing
``control_autograd`` once per granularity in turn (interleaved, so machine load hits all
three alike). Reported: the median per granularity and the medians' ratios to sublayer.

Memory: a fresh process per (granularity, repeat) that loads the model, builds the gate
set, and samples its resident set size every 2 ms while C is estimated: the peak RSS
during C (absolute: model + activations + captures) and its increase over the RSS just
before C. Reported: medians and their ratios to sublayer.

    .venv/bin/python benchmarks/bench_granularity.py [--n 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

GRANULARITIES = ("sublayer", "head", "neuron")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _setup(n: int):  # noqa: ANN202
    import torch

    from cdscope.core.batch import encode_probe
    from cdscope.core.models import load_model
    from cdscope.core.probes import draw_probe, load_pool

    torch.set_num_threads(1)
    loaded = load_model()
    batch = encode_probe(draw_probe(load_pool(), 0, n), loaded.tokenizer, "plain", pad_id=0)
    return loaded, batch


def memory_child(granularity: str, n: int) -> None:
    """One measurement in this (fresh) process: prints {peak, before} in bytes."""
    from cdscope.core.control import control_autograd
    from cdscope.core.gating.model import GatedModel

    loaded, batch = _setup(n)
    gm = GatedModel(loaded.model, granularity=granularity)
    peak, done = [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    before = _rss()
    thread = threading.Thread(target=sample)
    thread.start()
    with gm:
        control_autograd(gm, batch, 1)
    done.set()
    thread.join()
    print(json.dumps({"peak": max(peak[0], _rss()), "before": before}))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=1, help="probe items per family")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        memory_child(args.child, args.n)
        return

    from cdscope.core.control import control_autograd
    from cdscope.core.gating.model import GatedModel

    loaded, batch = _setup(args.n)
    gms = {g: GatedModel(loaded.model, granularity=g) for g in GRANULARITIES}
    times: dict[str, list[float]] = {g: [] for g in GRANULARITIES}
    for _ in range(args.repeats):
        for g in GRANULARITIES:
            with gms[g] as gm:
                start = time.perf_counter()
                control_autograd(gm, batch, 1)
                times[g].append(time.perf_counter() - start)
    memory: dict[str, list[dict]] = {g: [] for g in GRANULARITIES}
    for _ in range(args.repeats):
        for g in GRANULARITIES:
            out = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--child", g, "--n", str(args.n)],
                capture_output=True, text=True, check=True, timeout=1800,
            )  # fmt: skip
            memory[g].append(json.loads(out.stdout.strip().splitlines()[-1]))
    t0 = statistics.median(times["sublayer"])
    peak0 = statistics.median(m["peak"] for m in memory["sublayer"])
    grow0 = statistics.median(m["peak"] - m["before"] for m in memory["sublayer"])
    print(f"embedded model, {batch.B} probe rows (n = {args.n}), {args.repeats} repeats")
    print(f"{'granularity':<12}{'K':>8}{'C time s':>10}{'ratio':>7}{'peak MiB':>10}"
          f"{'ratio':>7}{'growth MiB':>12}{'ratio':>7}")  # fmt: skip
    for g in GRANULARITIES:
        t = statistics.median(times[g])
        peak = statistics.median(m["peak"] for m in memory[g])
        grow = statistics.median(m["peak"] - m["before"] for m in memory[g])
        print(
            f"{g:<12}{gms[g].gate_set.K:>8}{t:>10.2f}{t / t0:>7.2f}{peak / 2**20:>10.0f}"
            f"{peak / peak0:>7.2f}{grow / 2**20:>12.0f}{grow / grow0:>7.2f}"
        )
    print("C times per repeat:", {g: [round(x, 2) for x in v] for g, v in times.items()})


if __name__ == "__main__":
    main()
