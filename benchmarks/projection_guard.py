"""Follow-up to replication v2 (not pre-registered): CD-RFT with the projection step capped.

In the replication (docs/replication.md) CD-RFT seed 3's policy collapsed after step 1: its
projection stepped along a grad R of norm 275 and moved theta by 1.10 (docs/train.md, "When
the projection breaks the policy"). This reruns the replication's CD-RFT arm with
``--proj-max-norm X`` -- every other setting and tau_s from the replication's ledger
(``plan.json``, ``calibration/calibration.json``), the same held-out audit -- and compares
it with the ledger's GRPO and uncapped CD-RFT runs of the same seeds.

The cap acts only inside the projection loop, so a seed whose uncapped run never projected
(``proj_iters`` 0 in every step of its ledger log) trains bit for bit as before; its capped
result is the ledger's (said so in the table), not rerun. Everything here is post hoc and
exploratory: it decides nothing about claim 1.

    OMP_NUM_THREADS=1 python benchmarks/projection_guard.py --max-norm 10 --jobs 2
    python benchmarks/projection_guard.py --max-norm 10 --report-only   # the table again
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replication  # noqa: E402
from replication_ledger import collapsed_steps, interval, read_ledger  # noqa: E402

from cdscope.io import read_parquet  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ledger", type=Path, default=Path("docs/replication/data"))
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/projection_guard"))
    p.add_argument("--max-norm", type=float, default=10.0, help="--proj-max-norm of the reruns")
    p.add_argument("--jobs", type=int, default=1, help="runs at a time (1 thread each)")
    p.add_argument("--report-only", action="store_true", help="print the table, run nothing")
    return p.parse_args(argv)


def plan_args(ledger: Path, out: Path) -> argparse.Namespace:
    """The replication's settings (its ledger's plan.json) as replication.parse gives them."""
    plan = json.loads((ledger / "plan.json").read_text(encoding="utf-8"))
    args = replication.parse(["--ledger", str(ledger), "--out", str(out)])
    for key, value in plan.items():
        setattr(args, key, value)
    return args


def projected(log: pd.DataFrame) -> bool:
    return bool((log["proj_iters"] > 0).any())


def folder_of(out: Path, seed: int, cap: float) -> Path:
    return out / f"cdrft-s{seed}-cap{cap:g}"


def rerun(args: argparse.Namespace, cap: float, seed: int) -> None:
    """Train the capped CD-RFT run of ``seed`` to its final model, then audit it."""
    folder = folder_of(args.out, seed, cap)
    env = {"OMP_NUM_THREADS": "1"}
    if not (folder / "final" / "config.json").is_file():
        tau = f"{replication.tau_of(calibrated(args), seed):.4f}"
        argv = ["train", "--out-dir", str(folder), "--seed", str(seed), "--steps",
                str(args.steps), "--regularizer", "cdrft", *replication.common_train(args, 5),
                "--lambda", str(args.lam), "--tau", tau, "--k-max", str(args.k_max),
                "--proj-max-norm", f"{cap:g}"]  # fmt: skip
        run(argv, env)
    if not (folder / "decompose.parquet").is_file():
        run(replication.audit_argv(args, str(folder / "final"), folder), env)


def calibrated(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` whose ``out`` is the ledger (tau_of reads OUT/calibration/calibration.json)."""
    return argparse.Namespace(**{**vars(args), "out": args.ledger})


def run(argv: list[str], env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "cdscope", *argv]
    print("[projection_guard]", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, env={**os.environ, **env}, check=True)


def audit_mean(path: Path) -> float:
    frame, _ = read_parquet(path)
    return 100 * float(frame.loc[frame["measure"] == "B_shared_C", "value"].mean())


def table(args: argparse.Namespace, cap: float, seeds: list[int]) -> pd.DataFrame:
    """Per seed: the uncapped and capped CD-RFT runs against the ledger's GRPO run."""
    ledger = read_ledger(args.ledger)
    rows = []
    for seed in seeds:
        grpo, plain = ledger.unit(f"grpo-s{seed}"), ledger.unit(f"cdrft-s{seed}")
        folder = folder_of(args.out, seed, cap)
        same = not projected(plain.log)
        if same:
            log, audit = plain.log, audit_mean(args.ledger / "runs" / f"cdrft-s{seed}" /
                                               "decompose.parquet")  # fmt: skip
        elif (folder / "decompose.parquet").is_file():
            log, audit = (
                read_parquet(folder / "log.parquet")[0],
                audit_mean(folder / "decompose.parquet"),
            )
        else:
            continue
        base = audit_mean(args.ledger / "runs" / f"grpo-s{seed}" / "decompose.parquet")
        capped_unit = replication_unit(log, plain)
        rows.append({
            "seed": seed,
            "capped run": "ledger (never projected)" if same else str(folder),
            "proj iters": int(log["proj_iters"].sum()),
            "largest ||grad R||": float(log["grad_norm_proj"].max()) if "grad_norm_proj" in log
            else float("nan"),
            "collapsed (uncapped)": bool(collapsed_steps(plain)),
            "collapsed (capped)": bool(collapsed_steps(capped_unit)),
            "GRPO audit": base,
            "CD-RFT audit": audit_mean(args.ledger / "runs" / f"cdrft-s{seed}" /
                                       "decompose.parquet"),
            "capped audit": audit,
            "grpo reward": float(grpo.log["reward"].mean()),
            "capped reward": float(log["reward"].mean()),
        })  # fmt: skip
    frame = pd.DataFrame(rows)
    if len(frame):
        frame["delta uncapped"] = frame["CD-RFT audit"] - frame["GRPO audit"]
        frame["delta capped"] = frame["capped audit"] - frame["GRPO audit"]
    return frame


def replication_unit(log: pd.DataFrame, like):  # noqa: ANN001, ANN201
    """A ledger Unit holding ``log`` with ``like``'s config (for collapsed_steps)."""
    from replication_ledger import Unit

    return Unit(name="capped", log=log, log_meta=like.log_meta)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    args = plan_args(opts.ledger, opts.out)
    args.ledger = opts.ledger
    seeds = list(args.seeds)
    ledger = read_ledger(opts.ledger)
    todo = [s for s in seeds if projected(ledger.unit(f"cdrft-s{s}").log)]
    if not opts.report_only:
        with ThreadPoolExecutor(max(1, opts.jobs)) as pool:
            list(pool.map(lambda s: rerun(args, opts.max_norm, s), todo))
    frame = table(args, opts.max_norm, seeds)
    pd.set_option("display.width", 250)
    print(frame.round(2).to_string(index=False))
    if len(frame) == len(seeds):
        for column in ("delta uncapped", "delta capped"):
            stat = interval(frame[column].to_numpy() / 100)
            print(f"{column}: mean {100 * stat['mean']:+.2f} pp, SD {100 * stat['sd']:.2f}, "
                  f"95 % t-interval [{100 * stat['lo']:+.2f}, {100 * stat['hi']:+.2f}] over "
                  f"{stat['n']} seeds (post hoc)")  # fmt: skip
    print("seeds without a run yet:", sorted(set(seeds) - set(frame.get("seed", []))) or "none")
    return 0 if len(frame) else 3


if __name__ == "__main__":
    sys.exit(main())
