"""How far the thread count moves a probe's numbers (docs/resume.md, issue #26).

Runs ``cdscope probe`` in fresh processes: twice at 1 thread (OMP_NUM_THREADS=1: the
same process set-up must give the same bits) and once at each other thread count, then
prints, per count against the first 1-thread run, the largest relative difference of C
over all (seed, family, gate) and of B_shared(C) over seeds.

    .venv/bin/python benchmarks/resume_threads.py [--model smollm2-135m] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd


def probe(model: str, threads: int, out: Path, seeds: int, n: int) -> pd.DataFrame:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "cdscope.cli", "probe", "-m", model, "--seeds", str(seeds),
               "--n", str(n), "--device", "cpu", "-o", str(out)]  # fmt: skip
    subprocess.run(command, env=env, check=True, capture_output=True)
    return pd.read_parquet(out).sort_values(["seed", "family", "gate"]).reset_index(drop=True)


def b_shared_per_seed(frame: pd.DataFrame) -> np.ndarray:
    from cdscope.analysis.spectral import b_shared
    from cdscope.output.frames import control_matrices

    return np.array([b_shared(c) for _, (_, c) in sorted(control_matrices(frame).items())])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--n", type=int, default=3)
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        base = probe(args.model, 1, Path(tmp) / "a.parquet", args.seeds, args.n)
        runs = {"1 (again)": probe(args.model, 1, Path(tmp) / "b.parquet", args.seeds, args.n)}
        for count in counts:
            if count != 1:
                runs[str(count)] = probe(args.model, count, Path(tmp) / f"t{count}.parquet",
                                         args.seeds, args.n)  # fmt: skip
    ref_c, ref_b = base["C"].to_numpy(), b_shared_per_seed(base)
    print(f"model {args.model}, {args.seeds} seeds, n = {args.n}; against 1 thread:")
    for label, frame in runs.items():
        c = frame["C"].to_numpy()
        rel_c = np.max(np.abs(c - ref_c) / np.maximum(np.abs(ref_c), 1e-30))
        rel_b = np.max(np.abs(b_shared_per_seed(frame) - ref_b) / ref_b)
        same = "bit-identical" if np.array_equal(c, ref_c) else "differs"
        print(
            f"  threads {label:>9}: C {same}, max rel |dC| {rel_c:.1e}, max rel |dB_shared| {rel_b:.1e}"
        )


if __name__ == "__main__":
    main()
