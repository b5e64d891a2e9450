"""Replication v2's ledger (benchmarks/replication.py) read back, and its statistics.

The report reads nothing but the ledger folder: ``plan.json``, ``commands.txt``,
``timings.jsonl``, ``calibration/`` and every finished unit (a folder holding ``DONE``):
``runs/base``, ``runs/<arm>-s<seed>``, ``learn``. A unit without ``DONE`` has not finished
and counts as not run.

Statistics (cdscope.analysis.stats, SPEC §4), all in fractions here (the report shows
percent / percentage points):

* a model's audit value is its mean over the audit's probe seeds p (the same draws for
  every model);
* per training seed s, Delta_s = mean_p B(CD-RFT_s, p) - mean_p B(GRPO_s, p), computed over
  the probe seeds both audits hold; since the draws are shared this equals the mean of the
  per-probe-seed differences d_{s,p}, whose SE over p is the paper-style ``±``: probe noise
  of one trained pair, not training-seed variation;
* the pre-registered test is the paired Student-t interval of mean Delta_s over training
  seeds (S - 1 degrees of freedom); the number of seeds a paired t-test needs for a stated
  target effect (``PAPER_EFFECT``: the paper's, never the observed mean, which would be
  post-hoc power) comes with the range the SD's chi-square interval allows;
* verdict (pre-registered rule): *reproduced* when the interval lies below 0,
  *contradicted* above 0, *inconclusive* when it holds 0 or does not exist (one seed).

Claim 2 (``learn/eval_problems.parquet``, one row per state and held-out problem): a
problem's pass@1 at state s is correct / samples; per state s after the first (step 0) the
paired change d_q = pass@1_s(q) - pass@1_0(q) over the problems q both states hold, its
mean and the Student-t interval over problems (Q - 1 degrees of freedom), over all problems
and per family.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from cdscope.analysis.stats import (
    mean_se,
    paired_difference,
    seeds_needed,
    seeds_needed_interval,
    t_interval,
)
from cdscope.errors import CdscopeError
from cdscope.io import read_parquet

ARMS = ("grpo", "cdrft")
LABEL = {"base": "base", "grpo": "GRPO", "cdrft": "CD-RFT", "learn": "learn"}
#: the audit's plain measures (decompose.parquet): the primary and the two secondaries
PLAIN = ("B_shared_C", "B_dir", "B_norm")
#: the paper's paired CD-RFT - GRPO effects on Llama (fractions; reported as -5.5 +- 1.9 and
#: -7.6 +- 2.1 points): the targets of the seeds-needed columns; B_norm has none
PAPER_EFFECT = {"B_shared_C": 0.055, "B_dir": 0.076}
PAPER_SE = {"B_shared_C": 0.019, "B_dir": 0.021}
#: the noise-corrected twin and the eigenvalue mass clipped to read it (bshared.parquet)
CORRECTED, CLIPPED = "B_shared_C_unbiased", "gram_negative_mass"
#: a held-out problem's identity in eval_problems.parquet (ids are unique within a benchmark)
PROBLEM = ["benchmark", "problem_id"]
STEP_PHASES = ("rollout_s", "backbone_s", "measure_s", "regularizer_s", "projection_s", "step_s")


def unit_label(name: str) -> str:
    """A unit folder's name as the report writes it: ``cdrft-s3`` -> ``CD-RFT s3``."""
    arm, _, seed = name.partition("-s")
    return f"{LABEL.get(arm, arm)} s{seed}" if seed else LABEL.get(arm, arm)


def fail(message: str) -> SystemExit:
    """The report's one-line refusal of a ledger it cannot read."""
    return SystemExit(f"[replication report] {message}")


def parquet(path: Path) -> tuple[pd.DataFrame, dict]:
    try:
        return read_parquet(path)
    except CdscopeError as exc:
        raise fail(str(exc)) from exc


@dataclass
class Unit:
    """One finished unit's small outputs (None: the file is not in its ledger folder)."""

    name: str
    decompose: pd.DataFrame | None = None
    bshared: pd.DataFrame | None = None
    log: pd.DataFrame | None = None
    log_meta: dict = field(default_factory=dict)
    eval: pd.DataFrame | None = None
    audit: pd.DataFrame | None = None
    eval_problems: pd.DataFrame | None = None
    probe_meta: dict = field(default_factory=dict)
    _values: dict = field(default_factory=dict, repr=False)  # (source, measure) -> Series

    def values(self, measure: str, source: str = "decompose") -> pd.Series:
        """Per audit probe seed: ``measure`` of this model (index: probe seed)."""
        if (source, measure) not in self._values:
            self._values[source, measure] = self._read(measure, source)
        return self._values[source, measure]

    def _read(self, measure: str, source: str) -> pd.Series:
        frame = getattr(self, source)
        if frame is None:
            return pd.Series(dtype=float)
        rows = frame[frame["measure"] == measure]
        if rows["model"].nunique() > 1:
            raise fail(f"{self.name}/{source}.parquet holds several models; one expected")
        if rows["seed"].duplicated().any():
            raise fail(f"{self.name}/{source}.parquet holds {measure} twice for a probe seed")
        return rows.set_index("seed")["value"].astype(float).sort_index()


@dataclass
class Ledger:
    root: Path
    plan: dict
    commands: list[str]
    timings: pd.DataFrame
    calibration: dict[int, dict[str, float]]
    units: dict[str, Unit]

    def unit(self, name: str) -> Unit | None:
        return self.units.get(name)


def read_ledger(root: Path) -> Ledger:
    """Everything the report uses (module doc); missing parts are empty, never invented."""
    root = Path(root)
    if not root.is_dir():
        raise fail(f"ledger folder not found: {root}")
    plan = json.loads((root / "plan.json").read_text()) if (root / "plan.json").is_file() else {}
    commands = []
    if (root / "commands.txt").is_file():
        commands = [c for c in (root / "commands.txt").read_text().splitlines() if c.strip()]
    records = []
    if (root / "timings.jsonl").is_file():
        for number, line in enumerate((root / "timings.jsonl").read_text().splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise fail(f"{root}/timings.jsonl line {number} is not JSON: {exc}") from exc
    columns = ["phase", "name", "status", "cmd", "seconds", "at"]
    timings = pd.DataFrame(records, columns=columns)
    calibration = {}
    if (root / "calibration" / "DONE").is_file():
        table = json.loads((root / "calibration" / "calibration.json").read_text())
        calibration = {int(s): {k: float(v) for k, v in row.items()} for s, row in table.items()}
    folders = [p for p in sorted((root / "runs").glob("*")) if p.is_dir()]
    units = {p.name: read_unit(p) for p in [*folders, root / "learn"] if (p / "DONE").is_file()}
    return Ledger(root, plan, commands, timings, calibration, units)


def read_unit(folder: Path) -> Unit:
    unit = Unit(folder.name)
    for name in ("decompose", "bshared", "eval", "audit", "eval_problems"):
        if (folder / f"{name}.parquet").is_file():
            setattr(unit, name, parquet(folder / f"{name}.parquet")[0])
    if (folder / "log.parquet").is_file():
        unit.log, unit.log_meta = parquet(folder / "log.parquet")
        if unit.log.empty:
            raise fail(f"{folder}/log.parquet logs no step, yet the unit is marked DONE")
    if (folder / "decompose.probe.parquet").is_file():
        unit.probe_meta = parquet(folder / "decompose.probe.parquet")[1]
    return unit


# -- statistics ------------------------------------------------------------------------------


def interval(values: np.ndarray, target: float = math.nan) -> dict[str, float]:
    """mean, SE, SD, t-interval and n of per-seed values; with a stated ``target`` effect
    (never the observed mean) the seeds a paired t-test needs for it and their range."""
    values = np.asarray(values, dtype=float)
    mean, se, lo, hi = t_interval(values) if values.size else (math.nan,) * 4
    sd = se * math.sqrt(values.size) if values.size > 1 else math.nan
    low, high = seeds_needed_interval(target, sd, values.size)
    return {"mean": mean, "se": se, "sd": sd, "lo": lo, "hi": hi, "n": values.size,
            "target": target, "seeds_needed": seeds_needed(target, sd), "seeds_low": low,
            "seeds_high": high}  # fmt: skip


def count(x: float) -> str:
    """A seed count: n/a (NaN), > 100000 (out of reach) or an integer."""
    if x == math.inf:
        return "> 100000"
    return f"{x:.0f}" if math.isfinite(x) else "n/a"


def seeds_text(stat: dict[str, float]) -> str:
    """'17 [7, 579]' for a stat with a target; n/a without one or without a spread."""
    if not math.isfinite(stat["seeds_low"]):
        return "n/a"
    needed, low, high = (count(stat[k]) for k in ("seeds_needed", "seeds_low", "seeds_high"))
    return f"{needed} [{low}, {high}]"


def verdict(stat: dict[str, float], planned: int) -> str:
    """The pre-registered rule on a paired interval whose expected sign is negative. It is
    applied at the ``planned`` number of training seeds only: before that the interval is
    shown but no verdict is given (a rule applied at every interim look would be a test
    with optional stopping, whose error rate is not the stated alpha)."""
    if stat["n"] == 0:
        return "not run yet"
    if stat["n"] < planned:
        return f"no verdict yet (interim: {stat['n']} of {planned} training seeds)"
    lo, hi = stat["lo"], stat["hi"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        word = "inconclusive (one seed: no interval)"
    else:
        word = "reproduced" if hi < 0 else "contradicted" if lo > 0 else "inconclusive"
    return word


def pairs(ledger: Ledger, measure: str, seeds: list[int], source: str = "decompose"):
    """Per training seed with both arms finished: the two audit means, Delta_s and the
    paper-style mean +- SE over probe seeds of the per-probe-seed difference (module doc)."""
    rows = []
    for seed in seeds:
        grpo, cdrft = (ledger.unit(f"{arm}-s{seed}") for arm in ARMS)
        if grpo is None or cdrft is None:
            continue
        a, b = grpo.values(measure, source), cdrft.values(measure, source)
        common = a.index.intersection(b.index)
        if common.empty:
            continue
        diff = (b - a).loc[common].to_numpy()
        mean, se = mean_se(diff)
        rows.append({"seed": seed, "grpo": a.loc[common].mean(), "cdrft": b.loc[common].mean(),
                     "delta": mean, "probe_se": se, "probe_seeds": common.size})  # fmt: skip
    return pd.DataFrame(rows, columns=["seed", "grpo", "cdrft", "delta", "probe_se", "probe_seeds"])


def against_base(ledger: Ledger, measure: str, seeds: list[int], arm: str) -> np.ndarray:
    """arm_s - base per finished training seed, over the probe seeds both audits hold."""
    base = ledger.unit("base")
    if base is None:
        return np.array([])
    ref = base.values(measure)
    out = []
    for seed in seeds:
        unit = ledger.unit(f"{arm}-s{seed}")
        if unit is not None:
            values = unit.values(measure)
            common = values.index.intersection(ref.index)
            if not common.empty:
                out.append(float((values - ref).loc[common].mean()))
    return np.array(out)


def problem_passes(problems: pd.DataFrame, where: str) -> pd.DataFrame:
    """``problems`` checked (a one-line refusal otherwise) with each problem's pass@1 =
    correct / samples as ``pass1``."""
    missing = {"step", "family", "samples", "correct", *PROBLEM} - set(problems.columns)
    if missing:
        raise fail(f"{where} lacks the columns {sorted(missing)}")
    bad = (problems["samples"] < 1) | (problems["correct"] < 0)
    if (bad | (problems["correct"] > problems["samples"])).any():
        raise fail(f"{where} has a problem with samples < 1 or correct outside [0, samples]")
    if problems.duplicated(["step", *PROBLEM]).any():
        raise fail(f"{where} holds a problem twice at one step")
    return problems.assign(pass1=problems["correct"] / problems["samples"])


def problem_changes(problems: pd.DataFrame, where: str = "eval_problems.parquet") -> pd.DataFrame:
    """Claim 2's paired statistic (module doc): per state s after the first and per group
    (``all``, then each family), the problems both states hold (``n``), their mean pass@1
    at the first state and at s, and the mean change with its 95 % t-interval (fractions;
    NaN interval from one problem)."""
    passes = problem_passes(problems, where)
    states = sorted(passes["step"].unique())
    columns = ["step", "first", "family", "n", "before", "after", "mean", "lo", "hi"]
    rows: list[dict] = []
    if not states:
        return pd.DataFrame(rows, columns=columns)
    first = passes[passes["step"] == states[0]].set_index(PROBLEM)
    for step in states[1:]:
        now = passes[passes["step"] == step].set_index(PROBLEM)
        both = first.join(now[["pass1"]].rename(columns={"pass1": "pass1_s"}), how="inner")
        if both.empty:
            rows.append({"step": step, "first": states[0], "family": "all", "n": 0})
            continue
        for family, group in [("all", both), *both.groupby("family", sort=True)]:
            diff = paired_difference(group["pass1_s"].to_numpy(), group["pass1"].to_numpy())
            rows.append({"step": step, "first": states[0], "family": family, "n": diff.n,
                         "before": group["pass1"].mean(), "after": group["pass1_s"].mean(),
                         "mean": diff.mean, "lo": diff.ci_low, "hi": diff.ci_high})  # fmt: skip
    return pd.DataFrame(rows, columns=columns)


def covered_seconds(starts, ends) -> float:
    """The length of the union of the intervals [start, end]: the wall time of commands that
    ran side by side, without the gaps between invocations."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(zip(starts, ends, strict=True)):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def part_of(phase: str, name: str) -> str:
    """The report's name of the part a timings.jsonl record belongs to."""
    if phase in ("calibrate", "learn"):
        return {"calibrate": "calibration", "learn": "learn run (claim 2)"}[phase]
    if name == "base":
        return "base audit"
    arm = LABEL.get(name.split("-s")[0], name)
    return f"{arm} {'training' if phase == 'train' else 'audits'}"


def parts(timings: pd.DataFrame) -> pd.DataFrame:
    """Per part: units, commands done / stopped by --hours, their summed minutes, the
    wall minutes they covered, and the median minutes of one finished unit."""
    if timings.empty:
        return pd.DataFrame()
    rows = timings.assign(part=[part_of(p, n) for p, n in zip(timings["phase"], timings["name"],
                                                              strict=True)])  # fmt: skip
    rows["start"] = rows["at"] - rows["seconds"]
    out = []
    for part, group in rows.groupby("part", sort=False):
        per_unit = group.groupby("name")["seconds"].sum() / 60
        out.append({"part": part, "units": group["name"].nunique(),
                    "done": int((group["status"] == "done").sum()),
                    "stopped": int((group["status"] != "done").sum()),
                    "minutes": group["seconds"].sum() / 60,
                    "wall": covered_seconds(group["start"], group["at"]) / 60,
                    "per_unit": float(per_unit.median())})  # fmt: skip
    return pd.DataFrame(out)


def jobs_of(command: str) -> int:
    """``--jobs`` of one replication.py call (1 when not given)."""
    words = command.split()
    for i, word in enumerate(words):
        if word == "--jobs" and i + 1 < len(words):
            return int(words[i + 1])
        if word.startswith("--jobs="):
            return int(word.split("=", 1)[1])
    return 1


def training_curve(log: pd.DataFrame) -> pd.DataFrame:
    """Training-probe B_shared against the optimizer steps done: 0 is step 1's
    ``b_shared_before`` (the base weights), t is step t's ``b_shared_after``."""
    first = log.sort_values("step").iloc[0]
    start = pd.DataFrame({"step": [0], "b_shared": [first["b_shared_before"]]})
    after = log[["step", "b_shared_after"]].rename(columns={"b_shared_after": "b_shared"})
    return pd.concat([start, after], ignore_index=True).sort_values("step")


def idle_steps(logs: list[pd.DataFrame]) -> tuple[int, int]:
    """(steps with nothing to learn, steps) over ``logs``: ``skipped_fraction`` 1 means every
    completion's gradient was exactly 0 (each group's rewards equal; docs/train.md)."""
    logs = [log for log in logs if log is not None and "skipped_fraction" in log]
    idle = sum(int((log["skipped_fraction"] >= 1.0).sum()) for log in logs)
    return idle, sum(len(log) for log in logs)


def probe_fit(ledger: Ledger, seeds: list[int]) -> float | None:
    """Mean over finished seeds of CD-RFT_s - GRPO_s on the training probe after the last
    step (pp); None when no seed has both logs."""
    diffs = []
    for seed in seeds:
        units = [ledger.unit(f"{a}-s{seed}") for a in ARMS]
        logs = [None if u is None else u.log for u in units]
        if all(log is not None for log in logs):
            last = [training_curve(log)["b_shared"].iloc[-1] for log in logs]
            diffs.append(100 * (last[1] - last[0]))
    return float(np.mean(diffs)) if diffs else None


def projection_changes(ledger: Ledger, seeds: list[int]) -> np.ndarray:
    """Training-probe B_shared after the projection minus after the update (pp), for every
    CD-RFT step whose projection ran at least one iteration."""
    changes = []
    for seed in seeds:
        unit = ledger.unit(f"cdrft-s{seed}")
        if unit is not None and unit.log is not None:
            acted = unit.log[unit.log["proj_iters"] > 0]
            changes += list(100 * (acted["b_shared_after"] - acted["b_shared_after_update"]))
    return np.array(changes, dtype=float)


def collapsed_steps(unit: Unit | None) -> list[int]:
    """Steps of a training run whose rollouts show a collapsed policy: every completion ran
    to the ``--max-new-tokens`` cap (the log's ``completion_tokens`` is prompts x G x cap)
    and earned reward 0. A step's rollouts come from the weights the previous step left."""
    if unit is None or unit.log is None or "completion_tokens" not in unit.log:
        return []
    config = unit.log_meta.get("config", {})
    cap = config.get("prompts_per_step", 0) * config.get("group_size", 0)
    cap *= config.get("max_new_tokens", 0)
    log = unit.log
    hit = (log["completion_tokens"] == cap) & (log["reward"] == 0.0)
    return [int(s) for s in log.loc[hit, "step"]] if cap else []
