"""The figures of replication v2's report (benchmarks/replication_report.py).

(a) ``replication-delta.png``: per training seed Delta_s = CD-RFT_s - GRPO_s (points, with
    the paper-style +- SE over probe seeds; a seed with a collapsed run is labelled so), the paired t-interval over training seeds and
    the paper's effect as a band; B_shared (primary) and B_dir (secondary).
(b) ``replication-learn.png``: the learn run's pass@k on the held-out split (with, where
    the ledger has per-problem results, the paired 95 % t-interval of each state's pass@1
    change from step 0, drawn around the step-0 level plus the change), its audit B_shared
    and its training reward against the optimizer steps.
(c) ``replication-probe.png``: training-probe B_shared per step for both arms (each seed
    a line; CD-RFT's tau_s dotted) beside the audit values of the base and final models.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
from replication_ledger import (  # noqa: E402
    ARMS,
    LABEL,
    PAPER_EFFECT,
    PAPER_SE,
    Ledger,
    collapsed_steps,
    interval,
    pairs,
    problem_changes,
    training_curve,
)

COLOUR = {"base": "0.3", "grpo": "tab:blue", "cdrft": "tab:orange"}


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def delta_figure(ledger: Ledger, seeds: list[int], path: Path) -> Path | None:
    """(a): Delta_s per training seed, its t-interval and the paper's effect (module doc)."""
    frames = {m: pairs(ledger, m, seeds) for m in PAPER_EFFECT}
    if frames["B_shared_C"].empty:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (measure, frame) in zip(axes, frames.items(), strict=True):
        x = np.arange(len(frame))
        ax.errorbar(x, 100 * frame["delta"], yerr=100 * frame["probe_se"].fillna(0), fmt="o",
                    color="tab:purple", capsize=3,
                    label="Δ_s ± SE over probe seeds (probe noise)")  # fmt: skip
        stat = interval(frame["delta"].to_numpy())
        xm = len(frame) + 0.5
        if np.isfinite(stat["lo"]):
            ax.errorbar([xm], [100 * stat["mean"]], fmt="none", color="k", capsize=5, lw=2,
                        yerr=[[100 * (stat["mean"] - stat["lo"])],
                              [100 * (stat["hi"] - stat["mean"])]])  # fmt: skip
        ax.plot([xm], [100 * stat["mean"]], "D", color="k",
                label=f"mean over {stat['n']} seeds, 95 % t-interval")  # fmt: skip
        effect, se = -100 * PAPER_EFFECT[measure], 100 * PAPER_SE[measure]
        ax.axhspan(effect - se, effect + se, color="tab:green", alpha=0.15, lw=0)
        ax.axhline(effect, color="tab:green", lw=1.2, label=f"paper: {effect:g} ± {se:g}")
        ax.axhline(0, color="0.5", lw=0.8)
        ticks = [*x, xm]
        broken = [any(collapsed_steps(ledger.unit(f"{a}-s{s}")) for a in ARMS)
                  for s in frame["seed"]]  # fmt: skip
        ax.set_xticks(ticks, [f"s{s}" + ("\ncollapsed" if b else "")
                              for s, b in zip(frame["seed"], broken, strict=True)] + ["mean"])  # fmt: skip
        role = "primary" if measure == "B_shared_C" else "secondary"
        ax.set(xlabel="training seed", ylabel=f"Δ {measure}, CD-RFT − GRPO (pp)",
               title=f"{measure} ({role}), held-out audit")  # fmt: skip
        ax.legend(fontsize=8, loc="best")
    return save(fig, path)


def learn_figure(ledger: Ledger, path: Path) -> Path | None:
    """(b): the learn run's pass@k, audit B_shared and reward against the steps."""
    learn = ledger.unit("learn")
    if learn is None:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    if learn.eval is not None:
        overall = learn.eval[learn.eval["level"] == "overall"]
        for k, rows in overall.groupby("k"):
            rows = rows.sort_values("step")
            axes[0].plot(rows["step"], 100 * rows["pass_at_k"], "o-", label=f"pass@{k}")
    if learn.eval_problems is not None:
        changes = problem_changes(learn.eval_problems, "learn/eval_problems.parquet")
        rows = changes[(changes["family"] == "all") & (changes["n"] > 1)]
        if not rows.empty:
            axes[0].errorbar(rows["step"], 100 * rows["after"], fmt="_", color="k", capsize=4,
                             yerr=[100 * (rows["mean"] - rows["lo"]),
                                   100 * (rows["hi"] - rows["mean"])],
                             label="pass@1 change from step 0, paired 95 % t-interval")  # fmt: skip
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(fontsize=8)
    axes[0].set_ylim(0, 100)
    axes[0].set(xlabel="optimizer steps done", ylabel="pass@k on curriculum/eval (%)",
                title="held-out pass@k (overall)")  # fmt: skip
    if learn.audit is not None:
        table = learn.audit.pivot_table(index="step", columns="seed", values="b_shared") * 100
        for seed in table.columns:
            axes[1].plot(table.index, table[seed], color="tab:blue", alpha=0.25, lw=0.8)
        stats = [interval(row.dropna().to_numpy()) for _, row in table.iterrows()]
        mean = np.array([s["mean"] for s in stats])
        se = np.nan_to_num(np.array([s["se"] for s in stats]))
        axes[1].errorbar(table.index, mean, yerr=se, fmt="o-", color="tab:blue", capsize=3,
                         label="mean ± SE over audit draws")  # fmt: skip
        axes[1].legend(fontsize=8)
    axes[1].set(xlabel="optimizer steps done", ylabel="audit B_shared(C) (%)",
                title="held-out audit B_shared")  # fmt: skip
    if learn.log is not None:
        log = learn.log.sort_values("step")
        axes[2].plot(log["step"], log["reward"], color="0.6", lw=0.8, label="per step")
        span = max(1, min(10, len(log) // 4))
        axes[2].plot(log["step"], log["reward"].rolling(span, min_periods=1).mean(),
                     color="k", lw=1.8, label=f"mean of the last {span} steps")  # fmt: skip
        axes[2].legend(fontsize=8)
    axes[2].set(xlabel="optimizer step", ylabel="mean reward of the step's rollouts",
                title="training reward (mixes learning and prompt mix)")  # fmt: skip
    for ax in axes:
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    return save(fig, path)


def probe_figure(ledger: Ledger, seeds: list[int], path: Path) -> Path | None:
    """(c): training-probe B_shared per step for both arms against the audit values."""
    runs = {arm: {s: ledger.unit(f"{arm}-s{s}") for s in seeds} for arm in ARMS}
    if not any(u is not None and u.log is not None for r in runs.values() for u in r.values()):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    colours = plt.get_cmap("tab10")
    base = ledger.unit("base")
    for ax, arm in zip(axes, ARMS, strict=True):
        last = 0
        for i, (seed, unit) in enumerate(runs[arm].items()):
            if unit is None or unit.log is None:
                continue
            curve = training_curve(unit.log)
            last = max(last, int(curve["step"].max()))
            ax.plot(curve["step"], 100 * curve["b_shared"], "o-", color=colours(i), lw=1,
                    ms=3, label=f"s{seed} training probe")  # fmt: skip
            audit = unit.values("B_shared_C")
            if not audit.empty:
                ax.plot([curve["step"].max() + 0.15], [100 * audit.mean()], "D",
                        color=colours(i), mec="k")  # fmt: skip
            if arm == "cdrft":  # before the projection: where it had to act
                ax.plot(unit.log["step"], 100 * unit.log["b_shared_after_update"], "x",
                        color=colours(i), ms=5)  # fmt: skip
            tau = unit.log_meta.get("config", {}).get("tau")  # percent, as --tau
            if arm == "cdrft" and tau is not None:
                ax.axhline(tau, color=colours(i), ls=":", lw=0.9)
        if base is not None and not base.values("B_shared_C").empty:
            ax.plot([-0.15], [100 * base.values("B_shared_C").mean()], "s", color="k",
                    label="audit: base (square), final (diamonds)")  # fmt: skip
        extra = "\n× after the update, before projection; tau_s dotted" if arm == "cdrft" else ""
        ax.set(xlabel="optimizer steps done", title=f"{LABEL[arm]}: training vs audit probe{extra}")
        ax.set_xlim(-0.5, last + 0.5)
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("B_shared(C) (%)")
    return save(fig, path)


def figures(ledger: Ledger, seeds: list[int], img: Path, stem: str = "replication") -> list[Path]:
    """Every figure whose data exist, written under ``img`` as ``STEM-delta.png`` etc. (the
    report's file stem: v2's and v3's figures side by side)."""
    img.mkdir(parents=True, exist_ok=True)
    made = [
        delta_figure(ledger, seeds, img / f"{stem}-delta.png"),
        learn_figure(ledger, img / f"{stem}-learn.png"),
        probe_figure(ledger, seeds, img / f"{stem}-probe.png"),
    ]
    return [p for p in made if p is not None]
