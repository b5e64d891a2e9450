"""Replication v2 of the paper's training claims on the embedded model (issue 36).

Pre-registered in docs/replication/preregistration.md before any run; this script runs the design and
(replication_report.py) writes the tables, figures and verdicts under it.

Phases, each a ``cdscope`` command run as a user would run it:

1. ``calibrate``: ``cdscope bshared`` of the base model on the **train** half of the probe
   pool, probe seed s = training seed s, ``--n`` = the training probe's n: the B_shared
   of exactly the probe each run trains on (the hf loop draws its training probe from its
   seed, docs/train.md). tau_s = that B_shared - ``--tau-offset`` points, so the
   projection acts in every run (in issue 29's design tau = 70 never acted in 2 of 3
   seeds).
2. ``train`` (claim 1): for every training seed both arms, GRPO (``--regularizer none``)
   and CD-RFT (``cdrft``, tau_s), same seed hence same data order, rollout seeds and
   training probe; then ``cdscope decompose`` of the final model on the **audit** half
   (``--audit-seeds`` draws of ``--audit-n`` items per family: items no training probe
   holds) and ``cdscope bshared --from`` its probe frame (the noise-corrected column);
   the final weights are then deleted. The base model is audited the same way once.
3. ``learn`` (claim 2): one GRPO run of ``--learn-steps`` with in-training evidence:
   pass@k on the fixed held-out curriculum split and the same audit at steps 0, every
   ``--learn-every`` and the last (``--eval-every`` / ``--audit-every``).
4. ``report``: replication_report.py.

**Resumable across sessions.** Every unit (a calibration, a run and its audit, the learn
run) resumes within a session from its checkpoint or partial file, and once finished
copies its small outputs (log, audit and evidence Parquet, a few hundred KB in all) into
``--ledger`` (default ``docs/replication/data``, committed). A later call -- in another
session, on a fresh clone -- restores finished units from the ledger and runs only the
rest; ``OUT/plan.json`` and the ledger's ``plan.json`` refuse changed settings.
``--hours`` bounds one call's wall time; a unit stopped by it continues on the next call.

    # validation (a few minutes on 2 cores): 1 seed x 1 step, a 2-step learn run
    python benchmarks/replication.py --out /tmp/repl --ledger /tmp/repl-ledger --seeds 0 \\
        --steps 1 --prompts-per-step 2 --audit-seeds 2 --learn-steps 2 --learn-every 1 \\
        --eval-limit 1 --eval-n 2 --eval-k 1,2
    # the pre-registered run, in slices of at most 2 h:
    python benchmarks/replication.py --hours 2 --jobs 2 --doc docs/replication.md
    # v3 (pre-registered in docs/replication/preregistration-v3.md): the projection capped,
    # 8 fresh seeds, no learn run
    python benchmarks/replication.py --hours 2 --jobs 2 --seeds 6,7,8,9,10,11,12,13 \
        --proj-max-norm 10 --phases calibrate,train,report --ledger docs/replication/v3 \
        --out benchmarks/results/replication-v3 --doc docs/replication-v3.md \
        --preregistration docs/replication/preregistration-v3.md --name "Replication v3"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: every run of claim 1: (arm name, --regularizer)
ARMS = (("grpo", "none"), ("cdrft", "cdrft"))
FAMILIES = ("math", "code", "logic")
#: options that do not define the runs (may change between invocations)
FREE = ("hours", "phases", "doc", "out", "jobs", "ledger", "preregistration", "name")
#: the small outputs a finished unit keeps (copied to and restored from the ledger)
KEPT = ("log.parquet", "eval.parquet", "eval_problems.parquet", "audit.parquet", "decompose.parquet",
        "decompose.probe.parquet", "bshared.parquet", "calibration.json")  # fmt: skip
LEARN_SEED = 100  # the learn run's seed: no claim-1 run shares its data order
#: v2's pre-registration (``--preregistration``; v3's is docs/replication/preregistration-v3.md)
PREREGISTRATION = "docs/replication/preregistration.md"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/replication"))
    p.add_argument("--ledger", type=Path, default=Path("docs/replication/data"))
    p.add_argument("--seeds", default="0,1,2,3,4,5", help="training seeds, comma-separated")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps of every claim-1 run")
    p.add_argument("--hours", type=float, default=math.inf, help="wall budget of this call")
    p.add_argument("--phases", default="calibrate,train,learn,report")
    p.add_argument("--jobs", type=int, default=1, help="units at a time (1 thread each)")
    p.add_argument("--doc", type=Path, help="write the report here (figures in its img/)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lambda", dest="lam", type=float, default=1.0)
    p.add_argument("--tau-offset", type=float, default=10.0, help="tau_s = base B_shared - this")
    p.add_argument("--k-max", type=int, default=2)
    p.add_argument(
        "--proj-max-norm",
        type=float,
        default=None,
        help="CD-RFT's --proj-max-norm (v3; off: SPEC's plain projection step)",
    )
    p.add_argument(
        "--preregistration",
        type=Path,
        default=Path(PREREGISTRATION),
        help="the pre-registration the report copies verbatim above the results",
    )
    p.add_argument("--name", default="Replication v2", help="the report's title")
    p.add_argument("--probe-n", type=int, default=3, help="training probe items per family")
    p.add_argument("--audit-seeds", type=int, default=8, help="probe seeds of every audit")
    p.add_argument("--audit-n", type=int, default=3, help="audit items per family")
    p.add_argument("--learn-steps", type=int, default=60)
    p.add_argument("--learn-every", type=int, default=30, help="evidence every N learn steps")
    p.add_argument("--eval-n", type=int, default=4, help="samples per held-out problem")
    p.add_argument("--eval-k", default="1,2,4")
    p.add_argument("--eval-limit", type=int, help="first N problems of each generator")
    p.add_argument("--eval-max-new-tokens", type=int, default=32)
    args = p.parse_args(argv)
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.phases = args.phases.split(",")
    return args


def curriculum(split: str) -> list[str]:
    from cdscope.resources import default_task_dir

    return [str(default_task_dir() / "curriculum" / split / f"{f}.jsonl") for f in FAMILIES]


def run_dir(out: Path, arm: str, seed: int) -> Path:
    return out / "runs" / f"{arm}-s{seed}"


class Runner:
    """Runs ``python -m cdscope`` commands within the wall budget; logs their timings."""

    def __init__(self, ledger: Path, hours: float) -> None:
        self.ledger = ledger  # timings.jsonl: the wall time of every part, across sessions
        self.deadline = time.monotonic() + hours * 3600.0
        self.lock = threading.Lock()  # timings.jsonl lines from concurrent units
        self.children: set[subprocess.Popen] = set()  # running commands (stop_all)

    def __call__(self, phase: str, name: str, argv: list[str]) -> bool:
        """True when the command finished; False when the budget stopped (or precluded) it."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return False
        cmd = [sys.executable, "-m", "cdscope", *argv]
        print(f"[replication] {phase} {name}: {' '.join(cmd[1:])}", flush=True)
        began = time.monotonic()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread per unit: comparable times
        with subprocess.Popen(cmd, env=env) as child:
            self.children.add(child)
            try:
                code = child.wait(timeout=None if math.isinf(remaining) else remaining)
            except subprocess.TimeoutExpired:  # its unit resumes on the next call
                stop(child)
                code, status = None, "stopped by --hours"
            except BaseException:  # Ctrl-C, SIGTERM (main turns it into SystemExit)
                stop(child)
                raise
            finally:
                self.children.discard(child)
        if code is not None:
            if code != 0:
                raise SystemExit(f"[replication] {name} failed (exit {code}): {' '.join(cmd)}")
            status = "done"
        record = {"phase": phase, "name": name, "status": status, "cmd": cmd[1:]}
        record |= {"seconds": round(time.monotonic() - began, 1), "at": time.time()}
        with self.lock, open(self.ledger / "timings.jsonl", "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
        return status == "done"

    def stop_all(self) -> None:
        """Stop every running command (the main thread was interrupted)."""
        for child in list(self.children):
            stop(child)


def stop(child: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 30 s: cdscope's writes are atomic either way."""
    child.terminate()
    try:
        child.wait(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


def check_plan(args: argparse.Namespace) -> None:
    """OUT/plan.json and LEDGER/plan.json: written on the first call, then compared --
    a run continues only with the settings it started with."""
    plan = {k: v for k, v in vars(args).items() if k not in FREE}
    for folder in (args.out, args.ledger):
        path = folder / "plan.json"
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            changed = sorted(k for k in plan if saved.get(k) != plan[k])
            if changed:
                raise SystemExit(
                    f"[replication] {folder} holds a run with other settings "
                    f"({', '.join(changed)}); use the same arguments to continue it, or "
                    "another --out / --ledger"
                )
        else:
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")


# -- units and the ledger -------------------------------------------------------------------


def finished(args: argparse.Namespace, unit: Path) -> bool:
    """A unit is finished when its ledger folder holds DONE; its small outputs are then
    copied back into OUT (a fresh clone, another session)."""
    ledger = args.ledger / unit.relative_to(args.out)
    if not (ledger / "DONE").is_file():
        return False
    unit.mkdir(parents=True, exist_ok=True)
    for item in ledger.iterdir():
        if item.is_file() and not (unit / item.name).is_file():
            shutil.copy2(item, unit / item.name)
    return True


def record(args: argparse.Namespace, unit: Path) -> None:
    """Copy a finished unit's small outputs into the ledger, then mark it DONE."""
    ledger = args.ledger / unit.relative_to(args.out)
    ledger.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (unit / name).is_file():
            shutil.copy2(unit / name, ledger / name)
    (ledger / "DONE").write_text(time.strftime("%Y-%m-%dT%H:%M:%S") + "\n", encoding="utf-8")


def drop_weights(run: Path) -> None:
    """Delete a finished run's checkpoints and final model (GBs; the ledger keeps the rest)."""
    for name in ("checkpoints", "final"):
        if (run / name).is_dir():
            shutil.rmtree(run / name)


def prune_checkpoints(run: Path) -> None:
    """Delete checkpoints but the one ``latest`` names (what --resume continues)."""
    folder = run / "checkpoints"
    if not folder.is_dir():
        return
    latest = (folder / "latest").read_text().strip() if (folder / "latest").is_file() else None
    for child in folder.iterdir():
        if child.is_dir() and child.name != latest:
            shutil.rmtree(child)


def common_train(args: argparse.Namespace, save_every: int) -> list[str]:
    """The training settings every run shares (claim 1's arms and the learn run);
    ``save_every``: each checkpoint holds ~1.5 GB (weights + AdamW) and a run keeps them all."""
    return [
        "--model", args.model, "--prompts-per-step", str(args.prompts_per_step),
        "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
        "--temperature", str(args.temperature), "--lr", str(args.lr),
        "--probe-n", str(args.probe_n), "--probe-split", "train", "--save-every", str(save_every),
        "--device", "cpu", *[x for path in curriculum("train") for x in ("--tasks", path)],
    ]  # fmt: skip


def audit_argv(args: argparse.Namespace, model: str, folder: Path) -> list[str]:
    """``cdscope decompose`` of one model on the audit half (B_shared, B_dir, B_norm)."""
    out = folder / "decompose.parquet"
    argv = ["decompose", "-m", model, "--probe-split", "audit", "--seeds", str(args.audit_seeds)]
    argv += ["--n", str(args.audit_n), "--device", "cpu", "--out", str(out)]
    return argv + (["--resume"] if (folder / "decompose.probe.parquet").is_file() else [])


def audited(args: argparse.Namespace, runner: Runner, model: str, folder: Path) -> bool:
    """decompose, then bshared --from its probe frame (plain and noise-corrected B_shared)."""
    if not runner("audit", folder.name, audit_argv(args, model, folder)):
        return False
    frame = folder / "decompose.probe.parquet"
    return runner("audit", folder.name, ["bshared", "--from", str(frame), "--out",
                                         str(folder / "bshared.parquet")])  # fmt: skip


# -- phases -----------------------------------------------------------------------------------


def calibrate(args: argparse.Namespace, runner: Runner) -> bool:
    """Base B_shared on each training seed's own training probe -> tau_s (module doc)."""
    unit = args.out / "calibration"
    if finished(args, unit):
        return True
    unit.mkdir(parents=True, exist_ok=True)
    argv = ["bshared", "-m", args.model, "--probe-split", "train", "--n", str(args.probe_n)]
    argv += ["--seeds", str(max(args.seeds) + 1), "--device", "cpu"]
    argv += ["--out", str(unit / "bshared.parquet")]
    if (unit / "bshared.probe.parquet").is_file():
        argv.append("--resume")
    if not runner("calibrate", "base", argv):
        return False
    import pandas as pd

    rows = pd.read_parquet(unit / "bshared.parquet")
    rows = rows[rows["measure"] == "B_shared_C"].set_index("seed")["value"]
    table = {
        str(s): {"b_shared": 100 * float(rows[s]), "tau": 100 * float(rows[s]) - args.tau_offset}
        for s in args.seeds
    }
    (unit / "calibration.json").write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    record(args, unit)
    return True


def tau_of(args: argparse.Namespace, seed: int) -> float:
    """tau_s (percent), floored at 100/M = 33.34 (cdscope's lower bound for M = 3)."""
    table = json.loads((args.out / "calibration" / "calibration.json").read_text())
    return max(table[str(seed)]["tau"], 100.0 / len(FAMILIES) + 0.01)


def train_one(args: argparse.Namespace, runner: Runner, arm: str, seed: int) -> bool:
    """One claim-1 run to its final model, its audit, the ledger; False: budget stop."""
    run = run_dir(args.out, arm, seed)
    if finished(args, run):
        return True
    if not (run / "final" / "config.json").is_file():
        resume = (run / "checkpoints" / "latest").is_file()
        prune_checkpoints(run)
        argv = ["train", "--out-dir", str(run), "--seed", str(seed), "--steps", str(args.steps),
                "--regularizer", dict(ARMS)[arm], *common_train(args, 1)]  # fmt: skip
        if arm == "cdrft":
            argv += ["--lambda", str(args.lam), "--tau", f"{tau_of(args, seed):.4f}"]
            argv += ["--k-max", str(args.k_max)]
            if args.proj_max_norm is not None:
                argv += ["--proj-max-norm", f"{args.proj_max_norm:g}"]
        if not runner("train", run.name, argv + (["--resume"] if resume else [])):
            return False
    if not audited(args, runner, str(run / "final"), run):
        return False
    record(args, run)
    drop_weights(run)
    return True


def base_audit(args: argparse.Namespace, runner: Runner) -> bool:
    unit = args.out / "runs" / "base"
    if finished(args, unit):
        return True
    unit.mkdir(parents=True, exist_ok=True)
    if not audited(args, runner, args.model, unit):
        return False
    record(args, unit)
    return True


def units(args: argparse.Namespace, runner: Runner) -> list:
    """The learn run (it takes longest: started first, beside the others), the base audit
    and both arms of every seed, seed by seed (a budget stop leaves whole pairs first)."""
    todo = []
    if "learn" in args.phases:
        todo.append(lambda: learn(args, runner))
    if "train" in args.phases:
        todo.append(lambda: base_audit(args, runner))
        todo += [
            (lambda a=arm, s=seed: train_one(args, runner, a, s))
            for seed in args.seeds for arm, _ in ARMS
        ]  # fmt: skip
    return todo


def run_units(args: argparse.Namespace, runner: Runner) -> bool:
    """Every unit, ``--jobs`` at a time (each a process of its own at 1 thread)."""
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        try:
            done = list(pool.map(lambda unit: unit(), units(args, runner)))
        except BaseException:  # SIGTERM / Ctrl-C in the main thread: stop the workers' runs
            runner.stop_all()
            raise
    return all(done)


def learn(args: argparse.Namespace, runner: Runner) -> bool:
    """Claim 2: one GRPO run with pass@k and audits at 0, every --learn-every, the last."""
    run = args.out / "learn"
    if finished(args, run):
        return True
    if not (run / "final" / "config.json").is_file():
        resume = (run / "checkpoints" / "latest").is_file()
        prune_checkpoints(run)
        argv = ["train", "--out-dir", str(run), "--seed", str(LEARN_SEED), "--regularizer",
                "none", "--steps", str(args.learn_steps), *common_train(args, 10)]  # fmt: skip
        argv += ["--eval-every", str(args.learn_every), "--eval-n", str(args.eval_n)]
        argv += ["--eval-k", args.eval_k, "--eval-max-new-tokens", str(args.eval_max_new_tokens)]
        argv += [x for path in curriculum("eval") for x in ("--eval-tasks", path)]
        argv += ["--audit-every", str(args.learn_every), "--audit-seeds", str(args.audit_seeds)]
        argv += ["--audit-n", str(args.audit_n)]
        if args.eval_limit:
            argv += ["--eval-limit", str(args.eval_limit)]
        if not runner("learn", run.name, argv + (["--resume"] if resume else [])):
            return False
    record(args, run)
    drop_weights(run)
    return True


def code_version() -> str:
    """The commit the units of this call run (a run spans sessions; the code may move)."""
    here = Path(__file__).resolve().parents[1]  # the repository
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "cdscope"],
                               capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() + (" (cdscope/ modified)" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a killed run stops its child
    check_plan(args)
    with open(args.ledger / "commands.txt", "a", encoding="utf-8") as handle:  # for the report
        line = " ".join(["python benchmarks/replication.py", *(argv or sys.argv[1:])])
        handle.write(f"{line}  # code {code_version()}\n")
    runner = Runner(args.ledger, args.hours)
    if "calibrate" in args.phases and not calibrate(args, runner):
        print("[replication] stopped in calibrate (budget); run again to continue", flush=True)
        return 3
    if not run_units(args, runner):
        print("[replication] stopped by the budget; run again to continue", flush=True)
        return 3
    if "report" in args.phases:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from replication_report import write_report

        path = write_report(args)
        print(f"[replication] wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
