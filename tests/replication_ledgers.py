"""Synthetic replication ledgers in the real file formats, for the tests of
benchmarks/replication_report.py (tests/test_replication_report.py, test_replication_runs.py).

Each ledger is built so that the numbers the report must print are known: the audits'
per-probe-seed values are chosen so that Delta_s is exactly the stated delta and its
paper-style SE is a known constant, and the expected interval is computed here with
scipy.stats (the report uses cdscope.analysis.stats).
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from unittest.mock import patch

import numpy as np
import pandas as pd
from scipy import stats

from cdscope.io import write_parquet

ROOT = Path(__file__).resolve().parents[1]
SEEDS, PROBES = list(range(6)), list(range(8))
#: per-probe-seed offsets of CD-RFT - GRPO that sum to 0: Delta_s is exact, and its SE over
#: the 8 probe seeds is 0.004 * sqrt(8 / 7) / sqrt(8) = 0.004 / sqrt(7)
WIGGLE = 0.004 * np.array([1, -1] * 4)
PROBE_SE_PP = 100 * 0.004 / math.sqrt(7)


def _load(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


replication = _load("replication")
report = _load("replication_report")


def _audit(path: Path, model: str, values: dict[str, np.ndarray]) -> None:
    rows = [
        {"model": model, "seed": p, "measure": m, "family": None, "family_b": None,
         "value_unit": "fraction", "value": float(v[p]), "boot_low": float(v[p]) - 0.1,
         "boot_high": float(v[p]) + 0.1}
        for m, v in values.items() for p in PROBES
    ]  # fmt: skip
    write_parquet(pd.DataFrame(rows), path, {"command": "synthetic"})


def _unit(folder: Path, model: str, shared: np.ndarray, done: bool = True) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    plain = {"B_shared_C": shared, "B_dir": shared - 0.1, "B_norm": shared - 0.05}
    _audit(folder / "decompose.parquet", model, plain)
    mass = np.where(np.arange(8) == 0, 0.08, 0.01)  # one probe seed above the 5 % warning
    corrected = {"B_shared_C": shared, "B_shared_C_unbiased": shared + 0.25,
                 "gram_negative_mass": mass}  # fmt: skip
    _audit(folder / "bshared.parquet", model, corrected)
    write_parquet(pd.DataFrame({"model": [model]}), folder / "decompose.probe.parquet",
                  {"training_probe_overlap": {}})  # fmt: skip
    if done:
        (folder / "DONE").write_text("2026-11-28T00:00:00\n")


def _log(folder: Path, tau: float | None, start: float, steps: int = 5) -> None:
    step = np.arange(1, steps + 1)
    after = start - 0.02 * step
    frame = pd.DataFrame({
        "step": step, "reward": 0.1 + 0.05 * step, "b_shared_before": np.r_[start, after[:-1]],
        "b_shared_after_update": after + 0.01, "b_shared_after": after,
        "proj_iters": np.where(step <= 2, 2, 0) if tau else 0,
        "skipped_fraction": np.where(step == 1, 1.0, 0.25),  # step 1: nothing to learn
        **{c: float(i + 1) for i, c in enumerate(report.STEP_PHASES)},
    })  # fmt: skip
    config = {"seed": 0} | ({"tau": tau} if tau else {})
    write_parquet(frame, folder / "log.parquet", {"config": config})


#: the learn run's per-problem passes: 5 samples per problem, problems 0..5 in each of two
#: benchmarks (the same ids in both: a problem is (benchmark, problem_id)); the changes of
#: correct counts from step 0 are chosen so that the totals match eval.parquet's pass@1
#: (25 %, 30 %, 40 % of 60 samples) and each state's paired interval is known
SAMPLES = 5
CORRECT0 = {"math": [2, 1, 1, 1, 0, 2], "logic": [1, 2, 1, 1, 2, 1]}
CHANGE = {2: {"math": [0, 1, 0, 1, 0, 0], "logic": [1, 0, 0, 0, -1, 1]},
          4: {"math": [1, 2, 1, 1, 1, 1], "logic": [0, 1, 0, 1, 1, -1]}}  # fmt: skip


def _problems(folder: Path) -> None:
    rows = []
    for step in (0, *CHANGE):
        for fam, correct in CORRECT0.items():
            change = CHANGE[step][fam] if step else [0] * 6
            rows += [{"step": step, "benchmark": f"{fam}/b", "family": fam, "problem_id": str(i),
                      "samples": SAMPLES, "correct": c + d}
                     for i, (c, d) in enumerate(zip(correct, change, strict=True))]  # fmt: skip
    # a problem held at one state only: it must not enter any pair
    rows += [{"step": 0, "benchmark": "math/b", "family": "math", "problem_id": "dropped",
              "samples": SAMPLES, "correct": 5},
             {"step": 4, "benchmark": "logic/b", "family": "logic", "problem_id": "new",
              "samples": SAMPLES, "correct": 0}]  # fmt: skip
    write_parquet(pd.DataFrame(rows), folder / "eval_problems.parquet", {})


def build(
    root: Path, deltas_pp: list[float], finished: int = 6, learn: bool = True, problems: bool = True
) -> Path:
    """A ledger of the full design (seeds 0..5, 8 audit draws) with Delta_s = deltas_pp;
    seeds from ``finished`` on have GRPO done, CD-RFT still running (no DONE); the learn
    run's eval_problems.parquet only when ``problems``."""
    ledger = root / "ledger"
    ledger.mkdir(parents=True)
    (ledger / "plan.json").write_text(json.dumps({"seeds": SEEDS, "steps": 5}))
    call = "python benchmarks/replication.py --hours 2 --jobs 2 --doc docs/replication.md"
    (ledger / "commands.txt").write_text(f"{call}\n{call}\n{call} --phases report\n")
    records = [{"phase": "calibrate", "name": "base", "status": "done", "cmd": [],
                "seconds": 60.0, "at": 1000.0},
               {"phase": "train", "name": "grpo-s0", "status": "stopped by --hours", "cmd": [],
                "seconds": 120.0, "at": 1200.0},
               {"phase": "train", "name": "grpo-s0", "status": "done", "cmd": [],
                "seconds": 180.0, "at": 2000.0},
               {"phase": "train", "name": "cdrft-s0", "status": "done", "cmd": [],
                "seconds": 240.0, "at": 2060.0}]  # fmt: skip
    (ledger / "timings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (ledger / "calibration").mkdir()
    table = {str(s): {"b_shared": 63.0 + s, "tau": 53.0 + s} for s in SEEDS}
    (ledger / "calibration" / "calibration.json").write_text(json.dumps(table))
    (ledger / "calibration" / "DONE").write_text("x\n")
    base = 0.60 + 0.01 * (np.array(PROBES) - 3.5)
    _unit(ledger / "runs" / "base", "smollm2-135m", base)
    for s, delta in zip(SEEDS, deltas_pp, strict=True):
        grpo = base - 0.01 + 0.002 * s
        _unit(ledger / "runs" / f"grpo-s{s}", "grpo", grpo)
        _log(ledger / "runs" / f"grpo-s{s}", None, 0.63 + 0.01 * s)
        cdrft = grpo + delta / 100 + WIGGLE
        _unit(ledger / "runs" / f"cdrft-s{s}", "cdrft", cdrft, done=s < finished)
        _log(ledger / "runs" / f"cdrft-s{s}", 53.0 + s, 0.63 + 0.01 * s)
    if learn:
        folder = ledger / "learn"
        folder.mkdir()
        _log(folder, None, 0.6, steps=4)
        rows = []
        for step, p1 in ((0, 0.25), (2, 0.30), (4, 0.40)):
            for k, value in ((1, p1), (2, p1 + 0.1)):
                rows.append(
                    {
                        "step": step,
                        "level": "overall",
                        "family": "all",
                        "benchmark": "",
                        "k": k,
                        "pass_at_k": value,
                        "problems": 12,
                    }
                )
                for fam in ("math", "logic"):
                    rows.append(
                        {
                            "step": step,
                            "level": "family",
                            "family": fam,
                            "benchmark": "",
                            "k": k,
                            "pass_at_k": value,
                            "problems": 6,
                        }
                    )
                    rows.append({"step": step, "level": "benchmark", "family": fam,
                                 "benchmark": f"{fam}/b", "k": k, "pass_at_k": value,
                                 "problems": 6})  # fmt: skip
        write_parquet(pd.DataFrame(rows), folder / "eval.parquet", {})
        if problems:
            _problems(folder)
        audit = [{"step": step, "seed": p, "b_shared": 0.6 - 0.01 * step + 0.001 * p,
                  "b_dir": 0.5, "b_norm": 0.55, "b_shared_unbiased": 0.9,
                  "gram_negative_mass": 0.02} for step in (0, 2, 4) for p in PROBES]  # fmt: skip
        write_parquet(pd.DataFrame(audit), folder / "audit.parquet", {})
        (folder / "DONE").write_text("x\n")
    return ledger


def render(tmp_path: Path, deltas_pp: list[float], drawn: bool = False, **kwargs) -> str:
    """The report of ``build``'s ledger; its figures only when ``drawn`` (a second each:
    one test checks them)."""
    ledger = build(tmp_path, deltas_pp, **kwargs)
    doc = tmp_path / "doc" / "replication.md"
    args = replication.parse(["--out", str(tmp_path / "out"), "--ledger", str(ledger),
                              "--doc", str(doc), "--phases", "report"])  # fmt: skip
    with patch.object(report, "figures", report.figures if drawn else lambda *_: []):
        assert report.write_report(args) == doc
    return doc.read_text()


def tables(text: str) -> list[list[str]]:
    """The markdown's tables, each as its lines, with the heading above it first."""
    found, heading, current = [], "", []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
            continue
        if current:
            found.append([heading, *current])
            current = []
        if line.startswith("#") or (line and not line.startswith("!")):
            heading = line
    return found


def expected_interval(deltas_pp: list[float]) -> tuple[float, float, float, float]:
    d = np.asarray(deltas_pp)
    half = stats.t.ppf(0.975, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size)
    return d.mean(), d.std(ddof=1), d.mean() - half, d.mean() + half


REPRODUCED = [-6.5, -5.5, -6.0, -6.2, -5.8, -6.0]
