"""The report of benchmarks/replication.py: statistics, figures and the markdown.

Inputs (all under OUT): ``runs/<arm>-s<seed>/log.parquet`` (per-step training log),
``audit/decompose.parquet`` and ``audit/bshared.parquet`` (per probe seed), ``eval/passk.parquet``,
``timings.jsonl``. Statistics (cdscope.analysis.stats, SPEC §4): a model's audit value is
its mean over the probe seeds (the same probe draws for every model); the experimental
unit is the training seed s, so a comparison of arms is the paired difference over s,
Delta_s = value(CD-RFT_s) - value(GRPO_s) (and value(arm_s) - value(base)), reported as
mean, Student-t interval (S-1 degrees of freedom; none with one seed) and, for a measure
with a stated target effect (``PAPER_EFFECT``: the paper's paired effects), the number of
training seeds a paired t-test needs to detect that target with 80 % power, with the range
the SD's chi-square interval allows (never at the observed mean: that is post-hoc power, a
function of the p-value). A claim counts as reproduced when its interval excludes 0 on the
paper's side, contradicted when it excludes 0 on the other side, and inconclusive
otherwise.
"""

from __future__ import annotations

import json
import math
from argparse import Namespace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cdscope.analysis.stats import seeds_needed, seeds_needed_interval, t_interval  # noqa: E402
from cdscope.io import read_parquet  # noqa: E402

ARMS = ("grpo", "cdrft")
LABEL = {"base": "base", "grpo": "GRPO", "cdrft": "CD-RFT"}
COLOUR = {"base": "0.4", "grpo": "tab:blue", "cdrft": "tab:orange"}
WINDOW = 3  # steps averaged at the start and at the end of a reward curve
AUDIT_MEASURES = ("B_shared_C", "B_dir", "B_norm")
#: the stated target effects of the seeds-needed columns (fractions): the magnitudes of the
#: paper's paired CD-RFT - GRPO effects on Llama, Delta B_shared -5.5 +- 1.9 points and
#: Delta B_dir -7.6 +- 2.1 points; other quantities have no stated target and no column
PAPER_EFFECT = {"B_shared_C": 0.055, "B_dir": 0.076}


def window(steps: int) -> int:
    """Steps averaged at each end of a reward curve: WINDOW, fewer when the run is short."""
    return max(1, min(WINDOW, steps // 2))


def gains(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """Per seed: mean reward of the first and of the last ``window`` steps."""
    table = frame.pivot_table(index="step", columns="seed", values="reward")
    w = window(len(table))
    return table.head(w).mean(), table.tail(w).mean()


def model_label(key: tuple[str, int | None]) -> str:
    group, seed = key
    return LABEL[group] if seed is None else f"{LABEL[group]} s{seed}"


def fmt(x: float, digits: int = 2, sign: bool = True) -> str:
    """x with ``digits`` decimals (signed unless ``sign`` is False); n/a when not finite."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def count(x: float) -> str:
    """A seed count: n/a (NaN), > 100000 (out of reach) or an integer."""
    if x == math.inf:
        return "> 100000"
    return f"{x:.0f}" if math.isfinite(x) else "n/a"


def interval(values: np.ndarray, target: float = math.nan) -> dict[str, float]:
    """mean, t-interval and n of per-seed values; with a stated ``target`` effect (never the
    observed mean) the seeds a paired t-test needs to detect it and their chi-square range."""
    values = np.asarray(values, dtype=float)
    mean, se, lo, hi = t_interval(values) if values.size else (math.nan,) * 4
    sd = se * math.sqrt(values.size) if values.size > 1 else math.nan
    low, high = seeds_needed_interval(target, sd, values.size)
    return {"mean": mean, "lo": lo, "hi": hi, "n": values.size, "target": target,
            "seeds_needed": seeds_needed(target, sd), "seeds_low": low, "seeds_high": high}  # fmt: skip


def seeds_text(stat: dict[str, float]) -> str:
    """'17 [7, 579]' for a stat with a target; n/a without one or without a spread."""
    if not math.isfinite(stat["seeds_low"]):
        return "n/a"
    return (
        f"{count(stat['seeds_needed'])} [{count(stat['seeds_low'])}, {count(stat['seeds_high'])}]"
    )


def verdict(stat: dict[str, float], paper_sign: int) -> str:
    """reproduced / contradicted / inconclusive for a claim whose effect has ``paper_sign``."""
    lo, hi = stat["lo"], stat["hi"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "inconclusive (one seed: no interval)"
    if (paper_sign < 0 and hi < 0) or (paper_sign > 0 and lo > 0):
        return "reproduced"
    if (paper_sign < 0 and lo > 0) or (paper_sign > 0 and hi < 0):
        return "contradicted"
    more = ""
    if math.isfinite(stat["seeds_low"]):
        more = f"; {seeds_text(stat)} seeds would detect the paper's {100 * stat['target']:g} pp"
    return f"inconclusive (interval includes 0{more})"


# -- inputs ----------------------------------------------------------------------------------


def training_logs(out: Path, seeds: list[int]) -> dict[str, pd.DataFrame]:
    """Per arm: rows (seed, step, reward, b_shared_after, timings...) of every finished step."""
    logs: dict[str, pd.DataFrame] = {}
    for arm in ARMS:
        parts = []
        for seed in seeds:
            path = out / "runs" / f"{arm}-s{seed}" / "log.parquet"
            if path.is_file():
                parts.append(read_parquet(path)[0].assign(seed=seed))
        logs[arm] = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    return logs


def per_model(path: Path, specs: dict[str, tuple[str, int | None]], measures: list[str]):
    """{measure: {(group, seed): mean over probe seeds}} from an audit's per-seed Parquet."""
    if not path.is_file():
        return {}
    frame = read_parquet(path)[0]
    frame = frame[frame["measure"].isin(measures) & frame["model"].isin(list(specs))]
    means = frame.groupby(["measure", "model"])["value"].mean()
    out: dict[str, dict] = {}
    for (measure, model), value in means.items():
        out.setdefault(measure, {})[specs[model]] = float(value)
    return out


def deltas(values: dict, seeds: list[int], target: float = math.nan) -> dict[str, dict[str, float]]:
    """Paired over training seeds: arm - base and CD-RFT - GRPO (module doc), seeds needed
    for the stated ``target``."""
    base = values.get(("base", None), math.nan)
    pairs = {
        "GRPO - base": [values.get(("grpo", s), math.nan) - base for s in seeds],
        "CD-RFT - base": [values.get(("cdrft", s), math.nan) - base for s in seeds],
        "CD-RFT - GRPO": [values.get(("cdrft", s), math.nan) - values.get(("grpo", s), math.nan)
                          for s in seeds],
    }  # fmt: skip
    return {
        k: interval(np.array([d for d in v if math.isfinite(d)]), target) for k, v in pairs.items()
    }


# -- figures ---------------------------------------------------------------------------------


def curve(ax, frame: pd.DataFrame, column: str, arm: str, scale: float = 1.0) -> None:
    table = frame.pivot_table(index="step", columns="seed", values=column) * scale
    for seed in table.columns:
        ax.plot(table.index, table[seed], color=COLOUR[arm], alpha=0.25, lw=0.8)
    stats = [interval(row.dropna().to_numpy()) for _, row in table.iterrows()]
    mean = [s["mean"] for s in stats]
    ax.plot(table.index, mean, color=COLOUR[arm], lw=2, label=f"{LABEL[arm]} (mean of seeds)")
    lo, hi = [s["lo"] for s in stats], [s["hi"] for s in stats]
    ax.fill_between(table.index, lo, hi, color=COLOUR[arm], alpha=0.15, lw=0)


def figures(img: Path, logs: dict, audit: dict, passk: pd.DataFrame, specs: dict) -> list:
    img.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    if all(frame.empty for frame in logs.values()):
        return made
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm, frame in logs.items():
        if not frame.empty:
            curve(axes[0], frame, "reward", arm)
            first = frame[frame["step"] == frame["step"].min()]  # the start: before step 1
            start = first.assign(step=0, b_shared_after=first["b_shared_before"])
            curve(axes[1], pd.concat([start, frame]), "b_shared_after", arm, 100.0)
    axes[0].set(xlabel="step", ylabel="mean reward of the step's rollouts", title="reward")
    axes[1].set(xlabel="step", ylabel="B_shared on the training probe (%)",
                title="B_shared after each step (training probe)")  # fmt: skip
    for ax in axes:
        ax.legend(fontsize=8)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    made.append(save(fig, img / "replication-training.png"))
    if audit:
        names = [m for m in ("B_shared_C", "B_dir") if m in audit]
        fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
        for ax, measure in zip(axes[0], names, strict=True):
            for x, group in enumerate(("base", *ARMS)):
                ys = [100 * v for (g, _), v in audit[measure].items() if g == group]
                ax.scatter([x] * len(ys), ys, color=COLOUR[group], zorder=3)
                if ys:
                    ax.hlines(np.mean(ys), x - 0.3, x + 0.3, color=COLOUR[group], lw=2)
            for (group, seed), value in audit[measure].items():  # same-seed pairs joined
                partner = audit[measure].get(("cdrft", seed)) if group == "grpo" else None
                if partner is not None:
                    ax.plot([1, 2], [100 * value, 100 * partner], color="0.7", lw=0.8, zorder=1)
            ax.set_xticks(range(3), [LABEL[g] for g in ("base", *ARMS)])
            ax.set(ylabel=f"{measure} (%), mean over probe seeds", title=measure)
        made.append(save(fig, img / "replication-audit.png"))
    if not passk.empty:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for group in ("base", *ARMS):
            rows = passk[passk["group"] == group]
            stats = rows.groupby("k")["pass_at_k"].apply(lambda v: interval(100 * v.to_numpy()))
            ks = sorted(rows["k"].unique())
            ax.plot(ks, [stats[k]["mean"] for k in ks], "o-", color=COLOUR[group],
                    label=LABEL[group])  # fmt: skip
            ax.fill_between(ks, [stats[k]["lo"] for k in ks], [stats[k]["hi"] for k in ks],
                            color=COLOUR[group], alpha=0.15, lw=0)  # fmt: skip
        ax.set(xscale="log", xlabel="k", ylabel="pass@k (%), held-out curriculum",
               title="pass@k before and after training")  # fmt: skip
        ks = sorted(passk["k"].unique())
        ax.set_xticks(ks, [str(k) for k in ks])  # the measured k, not powers of ten
        ax.minorticks_off()
        ax.legend()
        made.append(save(fig, img / "replication-passk.png"))
    return made


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- the markdown ----------------------------------------------------------------------------

METHOD = """\
**Method.** From the base model, for each training seed s, two runs of `cdscope train` on
the learnable curriculum (`cdscope/data/tasks/curriculum/train`, 384 tasks: small
arithmetic, comparisons, counting, sorting three numbers, one-line Python functions;
[tasks.md](tasks.md)): **GRPO** (`--regularizer none`) and **CD-RFT** (`--regularizer
cdrft`: GRPO plus lambda grad R(C) on the training probe and the projection loop while
B_shared > tau). Both arms of a seed share every setting but the regulariser: the same
steps, the same data order and rollout seeds (both depend on (seed, step) only) and the
same training probe (drawn from the seed). Every final model and the base are then
audited with `cdscope decompose` over the audit's probe seeds (B_shared of C, B_dir,
B_norm; the same probe draws for every model) and `cdscope bshared --from` the same
probe frame, and evaluated with `cdscope eval` on the held-out split
(`curriculum/eval`, pass@k, unbiased estimator).

**Statistics.** A model's audit value is its mean over the probe seeds. The unit of
replication is the training seed: arms are compared by the paired difference over
seeds, Delta_s = value(CD-RFT_s) - value(GRPO_s) (and value(arm_s) - value(base)), with
its Student-t 95 % interval (S - 1 degrees of freedom) and, for B_shared and B_dir, the
number of training seeds a paired t-test needs to detect the paper's effect (5.5 and 7.6
points) with 80 % power, with the range the SD's own 95 % chi-square interval allows
(`cdscope.analysis.stats.seeds_needed_interval`; never at the observed mean, which would be
post-hoc power). Reward curves show the mean over seeds with
the per-step t-interval (shaded) and each seed (thin lines). A claim is *reproduced*
when its interval excludes 0 on the paper's side, *contradicted* when it excludes 0 on
the other side, *inconclusive* otherwise. The paper's numbers come from 7B models and
many more steps; this is a measurement at the scale this machine can train, not an
attempt to match them."""


def write_report(args: Namespace, specs: dict[str, tuple[str, int | None]]) -> Path:
    """OUT/replication.md (or ``args.doc``) with figures beside it in ``img/``."""
    out = Path(args.out)
    doc = Path(args.doc) if args.doc else out / "replication.md"
    img = doc.parent / "img"
    logs = training_logs(out, args.seeds)
    audit = per_model(out / "audit" / "decompose.parquet", specs, list(AUDIT_MEASURES))
    passk = pass_at_k(out / "eval" / "passk.parquet", specs)
    made = figures(img, logs, audit, passk, specs)
    lines = ["# A miniature replication: does CD-RFT lower control sharing below GRPO?", ""]
    lines += ["Written by `benchmarks/replication.py` from the run below.", "", METHOD, ""]
    lines += command_section(args, out, logs)
    if all(frame.empty for frame in logs.values()):
        lines += ["## Results", "", "Not run yet: run the command above.", ""]
    else:
        lines += reward_section(logs, args.seeds)
        lines += audit_section(out, audit, specs, args.seeds)
        lines += passk_section(passk, args.seeds)
        lines += claims_section(logs, audit, passk, args.seeds)
    lines += [f"![{p.stem}](img/{p.name})" for p in made] + [""]
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(lines), encoding="utf-8")
    return doc


def pass_at_k(path: Path, specs: dict) -> pd.DataFrame:
    if not path.is_file():
        return pd.DataFrame()
    frame = read_parquet(path)[0]
    frame = frame[(frame["subset"] == "all") & (frame["level"] == "overall")]
    frame = frame[frame["model"].isin(list(specs))].copy()
    frame["group"] = [specs[m][0] for m in frame["model"]]
    frame["seed"] = [specs[m][1] for m in frame["model"]]
    return frame


def covered_seconds(starts: pd.Series, ends: pd.Series) -> float:
    """The length of the union of the intervals [start, end]: wall time of commands that
    ran side by side, without the gaps between invocations."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(zip(starts, ends, strict=True)):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def command_section(args: Namespace, out: Path, logs: dict) -> list[str]:
    plan = json.loads((out / "plan.json").read_text()) if (out / "plan.json").is_file() else {}
    settings = ", ".join(f"{k} = {v}" for k, v in plan.items())
    calls = (
        (out / "commands.txt").read_text().splitlines() if (out / "commands.txt").is_file() else []
    )
    calls = [c for c in calls if not c.endswith("--phases report")]  # re-renders only
    resumed = len(calls) - len(dict.fromkeys(calls))  # the same command again continues the run
    calls = list(dict.fromkeys(calls))
    lines = ["## Command, settings and time", "", "```bash", *calls, "```", ""]
    if resumed:
        lines += [f"(run {resumed + 1} times: each call continued the stopped run; see below)", ""]
    lines += [f"Settings: {settings}.", ""]
    timings = out / "timings.jsonl"
    if timings.is_file():
        rows = pd.DataFrame([json.loads(x) for x in timings.read_text().splitlines() if x])
        rows["start"] = rows["at"] - rows["seconds"]
        phases = rows.groupby("phase", sort=False)
        spent = phases["seconds"].sum() / 60
        wall = phases.apply(lambda p: covered_seconds(p["start"], p["at"])) / 60
        parts = ", ".join(
            f"{phase} {spent[phase]:.1f} min of commands in {wall[phase]:.1f} min wall"
            for phase in spent.index
        )
        lines += [
            f"Time of the completed commands per phase ({args.jobs} at a time where a phase "
            f"runs several): {parts}; {spent.sum():.1f} min of commands in all. A command "
            "stopped part-way (a session that ended) is not counted; its rerun continued "
            "from its checkpoint or partial file.",
            "",
        ]
    columns = ["rollout_s", "backbone_s", "measure_s", "regularizer_s", "projection_s", "step_s"]
    table = ["| arm | steps logged | " + " | ".join(columns) + " |", "|---" * 8 + "|"]
    for arm, frame in logs.items():
        if not frame.empty:
            medians = " | ".join(f"{frame[c].median():.1f}" for c in columns)
            table.append(f"| {LABEL[arm]} | {len(frame)} | {medians} |")
    if len(table) > 2:
        lines += ["Median seconds per training step:", "", *table, ""]
    return lines


def reward_section(logs: dict, seeds: list[int]) -> list[str]:
    lines = ["## Does GRPO learn?", "",
             f"Reward = mean verifier reward of a step's rollouts; start / end = mean of the "
             f"first / last {WINDOW} steps of a seed (fewer in a run under {2 * WINDOW} steps); "
             "gain = end - start (interval over seeds).",
             "", "| arm | seeds | start | end | gain | 95 % interval |",
             "|---|---:|---:|---:|---:|---|"]  # fmt: skip
    for arm, frame in logs.items():
        if frame.empty:
            continue
        start, end = gains(frame)
        stat = interval((end - start).to_numpy())
        lines.append(
            f"| {LABEL[arm]} | {len(start)} | {start.mean():.3f} | {end.mean():.3f} | "
            f"{fmt(stat['mean'], 3)} | [{fmt(stat['lo'], 3)}, {fmt(stat['hi'], 3)}] |"
        )
    return [*lines, ""]


def audit_section(out: Path, audit: dict, specs: dict, seeds: list[int]) -> list[str]:
    if not audit:
        return ["## Control sharing", "", "The audits have not run yet.", ""]
    lines = ["## Control sharing of the final models (`cdscope decompose`, `cdscope bshared`)", ""]
    lines += ["Per model, mean over the audit's probe seeds (%):", ""]
    measures = [m for m in AUDIT_MEASURES if m in audit]
    lines += [
        "| model | " + " | ".join(measures) + " | folder |",
        "|---" * (len(measures) + 2) + "|",
    ]
    for spec, key in specs.items():
        if key in audit[measures[0]]:
            cells = " | ".join(f"{100 * audit[m].get(key, math.nan):.2f}" for m in measures)
            lines.append(f"| {model_label(key)} | {cells} | `{spec}` |")
    lines += ["", "Paired over training seeds (percentage points):", ""]
    lines += ["| comparison | measure | mean Δ | 95 % t-interval | seeds "
              "| seeds for the paper's Δ [95 % range] |"]  # fmt: skip
    lines += ["|---|---|---:|---|---:|---:|"]
    for measure in ("B_shared_C", "B_dir"):
        for name, stat in deltas(audit.get(measure, {}), seeds, PAPER_EFFECT[measure]).items():
            pp = {k: 100 * stat[k] for k in ("mean", "lo", "hi")}
            lines.append(
                f"| {name} | {measure} | {fmt(pp['mean'])} | [{fmt(pp['lo'])}, {fmt(pp['hi'])}] "
                f"| {stat['n']} | {seeds_text(stat)} |"
            )
    bshared = out / "audit" / "bshared.parquet"
    if bshared.is_file():
        frame = read_parquet(bshared)[0]
        frame = frame[frame["measure"] == "B_shared_C"]
        summary = frame.groupby("model")["value"].agg(["mean", "sem", "count"])
        lines += ["", "`cdscope bshared --from` the same probe frame, B_shared of C (%):", ""]
        lines += ["| model | mean ± SE over probe seeds | probe seeds |", "|---|---:|---:|"]
        for spec, key in specs.items():
            if spec in summary.index:
                row = summary.loc[spec]
                lines.append(
                    f"| {model_label(key)} | {100 * row['mean']:.2f} ± {100 * row['sem']:.2f} "
                    f"| {int(row['count'])} |"
                )
    return [*lines, ""]


def passk_section(passk: pd.DataFrame, seeds: list[int]) -> list[str]:
    if passk.empty:
        return ["## Capability", "", "The evaluation has not run yet.", ""]
    lines = ["## Capability: pass@k on the held-out curriculum (`cdscope eval`)", ""]
    lines += ["| k | base | GRPO | CD-RFT | CD-RFT - GRPO (paired) |", "|---:|---:|---:|---:|---|"]
    for k, rows in passk.groupby("k"):
        by = {g: rows[rows["group"] == g].set_index("seed")["pass_at_k"] * 100 for g in
              ("base", *ARMS)}  # fmt: skip
        base = by["base"].iloc[0] if len(by["base"]) else math.nan
        arms = {a: interval(by[a].to_numpy()) for a in ARMS}
        paired = interval((by["cdrft"] - by["grpo"]).dropna().to_numpy())
        cells = [f"{arms[a]['mean']:.1f} [{fmt(arms[a]['lo'], 1, False)}, "
                 f"{fmt(arms[a]['hi'], 1, False)}]" for a in ARMS]  # fmt: skip
        lines.append(
            f"| {k} | {base:.1f} | {cells[0]} | {cells[1]} | {fmt(paired['mean'], 1)} "
            f"[{fmt(paired['lo'], 1)}, {fmt(paired['hi'], 1)}] |"
        )
    return [*lines, ""]


def claims_section(logs: dict, audit: dict, passk: pd.DataFrame, seeds: list[int]) -> list[str]:
    lines = ["## Which of the paper's claims reproduce at this scale", ""]
    lines += ["| claim (paper) | measured here (mean, 95 % interval) | verdict |", "|---|---|---|"]
    shared = deltas(audit.get("B_shared_C", {}), seeds, PAPER_EFFECT["B_shared_C"])
    direction = deltas(audit.get("B_dir", {}), seeds, PAPER_EFFECT["B_dir"])

    def row(claim: str, stat: dict, sign: int, scale: float = 100.0, unit: str = " pp") -> None:
        text = (f"{fmt(scale * stat['mean'])}{unit} [{fmt(scale * stat['lo'])}, "
                f"{fmt(scale * stat['hi'])}], {stat['n']} seeds")  # fmt: skip
        lines.append(f"| {claim} | {text} | {verdict(stat, sign)} |")

    if "grpo" in logs and not logs["grpo"].empty:
        start, end = gains(logs["grpo"])
        row("GRPO raises the training reward", interval((end - start).to_numpy()), +1, 1.0, "")
    if audit:
        row("GRPO lowers B_shared (base > GRPO)", shared["GRPO - base"], -1)
        row("CD-RFT lowers it further (GRPO > CD-RFT)", shared["CD-RFT - GRPO"], -1)
        row("paired ΔB_dir < 0 (paper: -7.6 ± 2.1)", direction["CD-RFT - GRPO"], -1)
    if not passk.empty:
        top = passk[passk["k"] == passk["k"].max()]
        by = {a: top[top["group"] == a].set_index("seed")["pass_at_k"] for a in ARMS}
        stat = interval((by["cdrft"] - by["grpo"]).dropna().to_numpy())
        text = f"coverage at high k kept or improved (pass@{int(top['k'].max())}, CD-RFT - GRPO)"
        lines.append(
            f"| {text} | {fmt(100 * stat['mean'], 1)} pp [{fmt(100 * stat['lo'], 1)}, "
            f"{fmt(100 * stat['hi'], 1)}] | "
            + ("lost" if stat["hi"] < 0 else "kept or improved" if stat["lo"] >= 0 else
               "kept within the interval (a loss cannot be excluded)" if math.isfinite(stat["lo"])
               else "inconclusive (one seed: no interval)") + " |"
        )  # fmt: skip
    return [*lines, ""]
