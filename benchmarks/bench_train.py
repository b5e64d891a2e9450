"""Per-step time of the CD-RFT arm vs the GRPO arm, same seed and data, in one process.

Both arms run ``--steps`` steps from the same initial weights of the embedded model at
the reference geometry (``--prompts-per-step`` 8 x ``--group-size`` 4 = 32 completions
per step, SPEC §5) with the rollout cap ``--max-new-tokens`` (the reference is 512; the
default 64 fits a CPU run in minutes). ``--repeats R`` runs the arms R times, alternating
(GRPO, CD-RFT, GRPO, ...), so drift of a shared machine hits both alike; the figures
are medians over every logged step of an arm. Reported: per-step seconds split into
rollout / backbone / probe measurement / regulariser / projection, the CD-RFT overhead
in percent of the GRPO step, and the overhead by the number of projection iterations.

Overhead definitions: ``overhead_%`` = (CD-RFT step - GRPO step) / GRPO step, both
including the probe measurements both arms log; ``same-step overhead_%`` = (regulariser
+ projection) / (step - regulariser - projection) within each CD-RFT step (the GRPO step
it contains: rollout, backbone and the measurements both arms log, timed in the same
window, so load drift between arms does not enter; ``--arms cdrft`` runs only this);
``regulariser_%`` = (regulariser + projection seconds) / (rollout + backbone seconds) of
the CD-RFT arm, i.e. what CD-RFT adds to a GRPO step that does not measure the probe.

    .venv/bin/python benchmarks/bench_train.py [--steps 2] [--max-new-tokens 64] [--k-max 12] [--tau 70]
    .venv/bin/python benchmarks/bench_train.py --steps 1 --max-new-tokens 512   # reference length

``--compare-plain`` (issue 35) times the lean GRPO step against its plain twin instead
(``benchmarks/step_compare.py``): the same rollouts, the replication geometry, medians;
``--json F`` writes ``step_ratio`` and ``grad_max_rel_diff`` there.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_train.py --compare-plain --json F
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pandas as pd

PARTS = ["rollout_s", "backbone_s", "measure_s", "regularizer_s", "projection_s", "step_s"]


def main() -> None:
    from cdscope.settings.training import TrainConfig

    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each arm")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts-per-step", type=int, default=defaults.prompts_per_step)
    parser.add_argument("--group-size", type=int, default=defaults.group_size)
    parser.add_argument("--probe-n", type=int, default=3)
    parser.add_argument("--k-max", type=int, default=12)
    parser.add_argument(
        "--tau", type=float, default=defaults.tau,
        help="B_shared threshold (%%) of the projection loop; lower it to time projection iterations",
    )  # fmt: skip
    parser.add_argument("--arms", default="none,cdrft", help="none,cdrft or one of them")
    parser.add_argument("--estimator", default=defaults.estimator)
    parser.add_argument("--eps", type=float, default=defaults.eps)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/bench_train.parquet"))
    parser.add_argument(
        "--compare-plain", action="store_true",
        help="time the lean GRPO step against --plain-step on the same rollouts instead "
        "(every other option is then step_compare.py's: --steps, --json F, ...)",
    )  # fmt: skip
    if "--compare-plain" in sys.argv[1:]:
        import step_compare

        step_compare.main([a for a in sys.argv[1:] if a != "--compare-plain"])
        return
    args = parser.parse_args()

    from rich.console import Console
    from rich.table import Table

    from cdscope.commands.train import run_train
    from cdscope.io import run_metadata, write_parquet

    console = Console(stderr=True)
    logs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for arm in args.arms.split(","):
                cfg = TrainConfig(
                    out_dir=str(Path(tmp) / f"{arm}{repeat}"), steps=args.steps,
                    max_new_tokens=args.max_new_tokens, prompts_per_step=args.prompts_per_step,
                    group_size=args.group_size, probe_n=args.probe_n, k_max=args.k_max, tau=args.tau,
                    estimator=args.estimator, eps=args.eps, regularizer=arm, save_every=10**6,
                )  # fmt: skip
                log = run_train(cfg, console=console).log
                logs.append(log.assign(arm=arm, repeat=repeat))
                console.print(logs[-1][["arm", "step", "proj_iters", *PARTS]].round(1).to_string())
    frame = pd.concat(logs, ignore_index=True)
    write_parquet(
        frame, args.out, run_metadata("bench_train", **vars(args) | {"out": str(args.out)})
    )
    median = frame.groupby("arm")[[*PARTS, "completion_tokens"]].median()
    table = Table(
        title=f"bench_train: {args.steps} steps x {args.repeats} repeats per arm, "
        f"{args.prompts_per_step}x{args.group_size} completions, {args.max_new_tokens} new "
        f"tokens, probe n={args.probe_n}, {args.estimator} eps={args.eps:g}, tau={args.tau:g} "
        "(medians)"
    )
    table.add_column("arm")
    for part in [*PARTS, "completion_tokens"]:
        table.add_column(part, justify="right")
    for arm in median.index:
        table.add_row(arm, *[f"{median.loc[arm, p]:.1f}" for p in [*PARTS, "completion_tokens"]])
    console.print(table)
    if "cdrft" in median.index:
        cd = frame[frame["arm"] == "cdrft"]
        extra = cd["regularizer_s"] + cd["projection_s"]
        same_step = 100 * (extra / (cd["step_s"] - extra)).median()
        added = 100 * (extra / (cd["rollout_s"] + cd["backbone_s"])).median()
        if "none" in median.index:
            grpo_s, cd_s = median.loc["none", "step_s"], median.loc["cdrft", "step_s"]
            console.print(
                f"CD-RFT step overhead vs GRPO step: {100 * (cd_s - grpo_s) / grpo_s:+.1f}%"
            )
        console.print(
            f"same-step overhead (CD-RFT extras / the rest of its step): {same_step:+.1f}%"
        )
        console.print(f"regulariser + projection / (rollout + backbone): {added:.1f}%")
    by_iters = frame[frame["arm"] == "cdrft"].groupby("proj_iters")[PARTS].median()
    console.print("CD-RFT steps by projection iterations used (medians):")
    console.print(by_iters.round(1).to_string())
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
