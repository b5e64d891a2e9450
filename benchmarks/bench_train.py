"""Per-step time of the CD-RFT arm vs the GRPO arm, same seed and data, in one process.

Both arms run ``--steps`` steps from the same initial weights of the embedded model at
the reference geometry (8 prompts x 4 samples = 32 completions per step) with a short
rollout cap (``--max-new-tokens``, default 64) so a CPU run fits in minutes. Reported:
per-step seconds split into rollout / backbone / probe measurement / regulariser /
projection, the CD-RFT overhead in percent of the GRPO step, and the overhead by the
number of projection iterations the step used.

Overhead definitions: ``overhead_%`` = (CD-RFT step - GRPO step) / GRPO step, both
including the probe measurements both arms log; ``regulariser_%`` = (regulariser +
projection seconds) / (rollout + backbone seconds) of the CD-RFT arm, i.e. what CD-RFT
adds to a GRPO step that does not measure the probe.

    .venv/bin/python benchmarks/bench_train.py [--steps 2] [--max-new-tokens 64] [--k-max 12]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pandas as pd


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--probe-n", type=int, default=3)
    parser.add_argument("--k-max", type=int, default=12)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_train.parquet"))
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from cdscope.commands.train import run_train
    from cdscope.io import run_metadata, write_parquet
    from cdscope.train.config import TrainConfig

    console = Console(stderr=True)
    logs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm in ("none", "cdrft"):
            cfg = TrainConfig(
                out_dir=str(Path(tmp) / arm), steps=args.steps, max_new_tokens=args.max_new_tokens,
                probe_n=args.probe_n, k_max=args.k_max, regularizer=arm, save_every=10**6,
            )  # fmt: skip
            logs[arm] = run_train(cfg, console=console).log.assign(arm=arm)
    frame = pd.concat(logs.values(), ignore_index=True)
    parts = ["rollout_s", "backbone_s", "measure_s", "regularizer_s", "projection_s", "step_s"]
    mean = frame.groupby("arm")[parts].mean()
    grpo, cd = mean.loc["none"], mean.loc["cdrft"]
    table = Table(title=f"bench_train: {args.steps} steps/arm, 8x4 completions, "
                  f"{args.max_new_tokens} new tokens, probe n={args.probe_n}")  # fmt: skip
    table.add_column("arm")
    for part in parts:
        table.add_column(part, justify="right")
    for arm in ("none", "cdrft"):
        table.add_row(arm, *[f"{mean.loc[arm, p]:.1f}" for p in parts])
    console.print(table)
    overhead = 100 * (cd["step_s"] - grpo["step_s"]) / grpo["step_s"]
    added = 100 * (cd["regularizer_s"] + cd["projection_s"]) / (cd["rollout_s"] + cd["backbone_s"])
    console.print(f"CD-RFT step overhead vs GRPO step: {overhead:+.1f}%")
    console.print(f"regulariser + projection / (rollout + backbone): {added:.1f}%")
    by_iters = frame[frame["arm"] == "cdrft"].groupby("proj_iters")[parts].mean()
    console.print("CD-RFT steps by projection iterations used:")
    console.print(by_iters.round(1).to_string())
    write_parquet(
        frame, args.out, run_metadata("bench_train", **vars(args) | {"out": str(args.out)})
    )
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
