"""Miniature replication of the paper's training claims on the embedded model (issue #29).

From one base model, for every training seed s, two arms on the learnable curriculum
(cdscope/data/tasks/curriculum): GRPO (``--regularizer none``) and GRPO + CD-RFT
(``cdrft``), with matched ``--steps`` and the same seed, hence the same data order,
rollout seeds and training probe (docs/train.md). Then every final model and the base
are audited (``cdscope decompose``, ``cdscope bshared --from`` the same probe frame) and
evaluated on the held-out curriculum split (``cdscope eval``, pass@k), and the report
(replication_report.py) writes the figures and the markdown: reward curves with
intervals, pass@k before and after, B_shared and B_dir per model, paired same-seed
deltas with Student-t intervals and the seeds needed to detect them.

Every phase is a ``cdscope`` command run as a user would run it, and every one resumes:
training continues from its latest checkpoint (``--resume``; checkpoints every
``--save-every`` steps, pruned to the latest, deleted once ``final/`` exists), the
audit keeps finished (model, seed) pairs, eval keeps finished (model, problem) pairs. So
a killed run -- or one stopped by ``--hours``, the wall-clock budget of one invocation --
continues where it stopped when started again with the same arguments
(``OUT/plan.json`` refuses changed settings). ``OUT/timings.jsonl`` records each
command's wall time.

    # validation (1 seed x 2 steps, a few eval problems): minutes
    python benchmarks/replication.py --out /tmp/repl --seeds 0 --steps 2 --eval-limit 1 \\
        --eval-n 2 --eval-k 1,2 --audit-seeds 2
    # the full run; --doc writes docs/replication.md and its figures under docs/img/
    python benchmarks/replication.py --seeds 0,1,2 --steps 20 --hours 2 --doc docs/replication.md
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

#: every run of the replication: (arm name, --regularizer)
ARMS = (("grpo", "none"), ("cdrft", "cdrft"))
FAMILIES = ("math", "code", "logic")
#: options that do not define the runs (may change between invocations)
FREE = ("hours", "phases", "doc", "out", "jobs")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/replication"))
    p.add_argument("--seeds", default="0,1,2", help="training seeds, comma-separated")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps of every run")
    p.add_argument("--hours", type=float, default=math.inf, help="wall budget of this call")
    p.add_argument("--phases", default="train,audit,eval,report")
    p.add_argument("--jobs", type=int, default=1, help="training runs at a time")
    p.add_argument("--doc", type=Path, help="write the report here (figures in its img/)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--lambda", dest="lam", type=float, default=1.0)
    p.add_argument("--tau", type=float, default=70.0)
    p.add_argument("--k-max", type=int, default=12)
    p.add_argument("--probe-n", type=int, default=3, help="training probe items per family")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--device", default="auto")
    p.add_argument("--audit-seeds", type=int, default=5, help="probe seeds of the audits")
    p.add_argument("--audit-n", type=int, default=3, help="probe items per family (audits)")
    p.add_argument("--eval-n", type=int, default=8, help="samples per held-out problem")
    p.add_argument("--eval-k", default="1,2,4,8")
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


def models(args: argparse.Namespace) -> dict[str, tuple[str, int | None]]:
    """``--model`` spec -> (group, training seed): the base first, then every final model."""
    specs: dict[str, tuple[str, int | None]] = {args.model: ("base", None)}
    for arm, _ in ARMS:
        for seed in args.seeds:
            specs[str(run_dir(args.out, arm, seed) / "final")] = (arm, seed)
    return specs


class Runner:
    """Runs ``python -m cdscope`` commands within the wall budget; logs their timings."""

    def __init__(self, out: Path, hours: float) -> None:
        self.out = out
        self.deadline = time.monotonic() + hours * 3600.0
        self.lock = threading.Lock()  # timings.jsonl lines from concurrent training runs
        self.children: set[subprocess.Popen] = set()  # running commands (stop_all)

    def __call__(self, phase: str, name: str, argv: list[str]) -> bool:
        """True when the command finished; False when the budget stopped (or precluded) it."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return False
        cmd = [sys.executable, "-m", "cdscope", *argv]
        print(f"[replication] {phase} {name}: {' '.join(cmd[1:])}", flush=True)
        began = time.monotonic()
        with subprocess.Popen(cmd) as child:
            self.children.add(child)
            try:
                code = child.wait(timeout=None if math.isinf(remaining) else remaining)
            except subprocess.TimeoutExpired:  # its phase resumes on the next call
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
        with self.lock, open(self.out / "timings.jsonl", "a", encoding="utf-8") as handle:
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
    """Write OUT/plan.json on the first call; refuse to continue with other settings."""
    plan = {k: v for k, v in vars(args).items() if k not in FREE}
    path = args.out / "plan.json"
    if path.is_file():
        saved = json.loads(path.read_text(encoding="utf-8"))
        changed = sorted(k for k in plan if saved.get(k) != plan[k])
        if changed:
            raise SystemExit(
                f"[replication] {args.out} holds a run with other settings ({', '.join(changed)}); "
                "use the same arguments to continue it, or another --out"
            )
        return
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan, indent=1) + "\n", encoding="utf-8")


def prune_checkpoints(run: Path, keep_latest: bool) -> None:
    """Delete checkpoints but the one ``latest`` names (all of them when not keep_latest)."""
    folder = run / "checkpoints"
    if not folder.is_dir():
        return
    latest = (folder / "latest").read_text().strip() if (folder / "latest").is_file() else None
    for child in folder.iterdir():
        if child.is_dir() and not (keep_latest and child.name == latest):
            shutil.rmtree(child)
    if not keep_latest:
        shutil.rmtree(folder)


def train_one(args: argparse.Namespace, runner: Runner, arm: str, seed: int) -> bool:
    """One run to its final model (continuing its latest checkpoint); False: budget stop."""
    run = run_dir(args.out, arm, seed)
    if not (run / "final" / "config.json").is_file():
        resume = (run / "checkpoints" / "latest").is_file()
        prune_checkpoints(run, keep_latest=True)
        argv = [
            "train", "--model", args.model, "--out-dir", str(run), "--seed", str(seed),
            "--regularizer", dict(ARMS)[arm], "--steps", str(args.steps),
            "--prompts-per-step", str(args.prompts_per_step),
            "--group-size", str(args.group_size), "--max-new-tokens", str(args.max_new_tokens),
            "--temperature", str(args.temperature), "--lr", str(args.lr),
            "--lambda", str(args.lam), "--tau", str(args.tau), "--k-max", str(args.k_max),
            "--probe-n", str(args.probe_n), "--save-every", str(args.save_every),
            "--device", args.device,
            *[x for path in curriculum("train") for x in ("--tasks", path)],
            *(["--resume"] if resume else []),
        ]  # fmt: skip
        if not runner("train", run.name, argv):
            return False
    prune_checkpoints(run, keep_latest=False)
    return True


def train(args: argparse.Namespace, runner: Runner) -> bool:
    """Both arms of every seed, seed by seed (a budget stop leaves whole pairs first),
    ``--jobs`` runs at a time (each a process of its own; mind OMP_NUM_THREADS)."""
    runs = [(arm, seed) for seed in args.seeds for arm, _ in ARMS]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        try:
            done = list(pool.map(lambda run: train_one(args, runner, *run), runs))
        except BaseException:  # SIGTERM / Ctrl-C in the main thread: stop the workers' runs
            runner.stop_all()
            raise
    return all(done)


def audit(args: argparse.Namespace, runner: Runner) -> bool:
    """``cdscope decompose`` of base + finals (measures the probe once), then ``bshared --from``."""
    folder = args.out / "audit"
    folder.mkdir(parents=True, exist_ok=True)
    decompose = folder / "decompose.parquet"
    probe_frame = folder / "decompose.probe.parquet"
    argv = ["decompose", *[x for m in models(args) for x in ("-m", m)]]
    argv += ["--seeds", str(args.audit_seeds), "--n", str(args.audit_n), "--device", args.device]
    argv += ["--out", str(decompose), "--plot", str(folder / "decompose.png")]
    if probe_frame.is_file():
        argv.append("--resume")
    if not runner("audit", "decompose", argv):
        return False
    bshared = ["bshared", "--from", str(probe_frame), "--out", str(folder / "bshared.parquet")]
    return runner("audit", "bshared", [*bshared, "--plot", str(folder / "bshared.png")])


def evaluate(args: argparse.Namespace, runner: Runner) -> bool:
    """``cdscope eval`` of base + finals on the held-out curriculum split."""
    folder = args.out / "eval"
    argv = ["eval", *[x for m in models(args) for x in ("-m", m)]]
    argv += [x for path in curriculum("eval") for x in ("--tasks", path)]
    argv += ["--n", str(args.eval_n), "--k", args.eval_k, "--device", args.device]
    argv += ["--max-new-tokens", str(args.eval_max_new_tokens), "--out", str(folder)]
    argv += ["--plot", str(folder / "passk.png")]
    if args.eval_limit:
        argv += ["--limit", str(args.eval_limit)]
    # a finished eval, or one stopped part-way (its samples.partial.parquet), continues
    if any((folder / name).is_file() for name in ("samples.parquet", "samples.partial.parquet")):
        argv.append("--resume")
    return runner("eval", "eval", argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so a killed run stops its child
    check_plan(args)
    with open(args.out / "commands.txt", "a", encoding="utf-8") as handle:  # for the report
        handle.write(" ".join(["python benchmarks/replication.py", *(argv or sys.argv[1:])]) + "\n")
    runner = Runner(args.out, args.hours)
    phases = {"train": train, "audit": audit, "eval": evaluate}
    for name in ("train", "audit", "eval"):
        if name in args.phases and not phases[name](args, runner):
            print(f"[replication] stopped in {name} (budget); run again to continue", flush=True)
            return 3
    if "report" in args.phases:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from replication_report import write_report

        path = write_report(args, models(args))
        print(f"[replication] wrote {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
