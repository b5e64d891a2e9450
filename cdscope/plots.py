"""Figures readable at paper size (matplotlib, Agg backend, PNG or PDF, atomic writes).

- ``plot_audit``: per-model bars (mean ± SE over seeds) with per-seed points for the
  headline measures, plus a forest plot of same-seed paired deltas (95% t-interval)
  when there are several models.
- ``plot_decompose``: B_shared, B_dir, B_norm side by side, and the |cos| matrix of
  family rows (mean over seeds) per model.
- ``plot_random_reference``: histogram of the random-reference B_shared with the
  measured value and the 95th/99th percentiles marked.
"""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from cdscope.io import atomic_write_bytes, check_plot_path  # noqa: E402

PALETTE = ["#1f4e79", "#c55a11", "#548235", "#7030a0", "#bf9000", "#2e75b6", "#a50021"]
LABELS = {
    "B_shared_C": "B_shared(C)",
    "B_shared_F": "B_shared(F)",
    "R_C": "R(C)",
    "ACG": "ACG",
    "B_dir": "B_dir",
    "B_norm": "B_norm",
}


def _save(fig: plt.Figure, path: Path) -> None:
    fmt = check_plot_path(path)
    atomic_write_bytes(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=200, bbox_inches="tight"))
    plt.close(fig)


def _short(name: str, width: int = 22) -> str:
    name = Path(name).name if "/" in name and Path(name).exists() else name
    return name if len(name) <= width else "…" + name[-(width - 1) :]


def _style() -> None:
    plt.rcParams.update(
        {
            "font.size": 10,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
        }
    )


def _bars(
    ax: plt.Axes,
    per_seed: pd.DataFrame,
    summary: pd.DataFrame,
    measures: list[str],
    models: list[str],
) -> None:
    """Grouped bars: one group per measure, one bar per model, per-seed points on top."""
    width = 0.8 / len(models)
    rng = np.random.default_rng(0)
    for i, model in enumerate(models):
        for j, measure in enumerate(measures):
            row = summary[(summary["model"] == model) & (summary["measure"] == measure)]
            if row.empty:
                continue
            x = j + (i - (len(models) - 1) / 2) * width
            mean, se = 100 * float(row["mean"].iloc[0]), 100 * float(row["se"].iloc[0])
            ax.bar(
                x,
                mean,
                width * 0.9,
                color=PALETTE[i % len(PALETTE)],
                alpha=0.55,
                label=_short(model) if j == 0 else None,
            )
            ax.errorbar(x, mean, yerr=0 if np.isnan(se) else se, color="black", capsize=4, lw=1.2)
            seeds = (
                100
                * per_seed[(per_seed["model"] == model) & (per_seed["measure"] == measure)]["value"]
            )
            jitter = rng.uniform(-width * 0.25, width * 0.25, len(seeds))
            ax.scatter(
                x + jitter,
                seeds,
                s=14,
                color=PALETTE[i % len(PALETTE)],
                edgecolor="black",
                linewidth=0.5,
                zorder=3,
            )
    ax.set_xticks(range(len(measures)), [LABELS.get(m, m) for m in measures])
    ax.set_ylabel("percent (mean ± SE over seeds, dots = seeds)")
    ax.axhline(0, color="grey", lw=0.6)
    ax.legend(frameon=False, fontsize=9, loc="best")


def _forest(ax: plt.Axes, paired: pd.DataFrame, measures: list[str]) -> None:
    """Paired deltas (model - reference) with 95% t-intervals, in percentage points."""
    rows = paired[paired["measure"].isin(measures)].reset_index(drop=True)
    labels = []
    for y, row in rows.iterrows():
        mean, lo, hi = 100 * row["mean"], 100 * row["ci_low"], 100 * row["ci_high"]
        color = PALETTE[
            (list(dict.fromkeys(paired["model"])).index(row["model"]) + 1) % len(PALETTE)
        ]
        if not np.isnan(lo):
            ax.plot([lo, hi], [y, y], color=color, lw=2)
        ax.plot(mean, y, "o", color=color, ms=7)
        labels.append(
            f"{_short(row['model'], 18)}\n{LABELS.get(row['measure'], row['measure'])}  "
            f"({row['n_negative']}/{row['n']} < 0)"
        )
    ax.axvline(0, color="grey", lw=1, ls="--")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylim(max(len(rows), 2) - 0.5, -0.5)  # top to bottom, no empty band for few rows
    reference = _short(str(paired["reference"].iloc[0])) if len(paired) else ""
    ax.set_xlabel(f"Δ vs {reference} (percentage points, 95% t-interval)")
    ax.set_title("Same-seed paired differences")


def plot_audit(
    path: Path,
    title: str,
    per_seed: pd.DataFrame,
    summary: pd.DataFrame,
    paired: pd.DataFrame,
    measures: list[str],
) -> None:
    _style()
    models = list(dict.fromkeys(per_seed["model"]))
    several = len(models) > 1 and not paired.empty
    fig, axes = plt.subplots(
        1,
        2 if several else 1,
        figsize=(11 if several else 6, 4.2),
        gridspec_kw={"width_ratios": [1.1, 1]} if several else None,
        squeeze=False,
    )
    _bars(axes[0, 0], per_seed, summary, measures, models)
    n_seeds = int(summary["n_seeds"].max()) if len(summary) else 0
    axes[0, 0].set_title(f"{title} — {n_seeds} seed(s)")
    if several:
        _forest(axes[0, 1], paired, measures)
    fig.tight_layout()
    _save(fig, path)


def plot_decompose(path: Path, per_seed: pd.DataFrame, summary: pd.DataFrame) -> None:
    _style()
    models = list(dict.fromkeys(per_seed["model"]))
    fig, axes = plt.subplots(
        1, 1 + len(models), figsize=(5.5 + 3.6 * len(models), 4.2), squeeze=False
    )
    _bars(axes[0, 0], per_seed, summary, ["B_shared_C", "B_dir", "B_norm"], models)
    axes[0, 0].set_title("Bottleneck decomposition")
    for i, model in enumerate(models):
        ax = axes[0, i + 1]
        cos = summary[(summary["model"] == model) & summary["measure"].str.startswith("abs_cos[")]
        pairs = [re.match(r"abs_cos\[(.+)\|(.+)\]", m).groups() for m in cos["measure"]]  # type: ignore[union-attr]
        families = sorted({f for pair in pairs for f in pair})
        matrix = np.eye(len(families))
        for (a, b), value in zip(pairs, cos["mean"], strict=True):
            ia, ib = families.index(a), families.index(b)
            matrix[ia, ib] = matrix[ib, ia] = value
        image = ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis")
        for ia in range(len(families)):
            for ib in range(len(families)):
                ax.text(
                    ib,
                    ia,
                    f"{matrix[ia, ib]:.2f}",
                    ha="center",
                    va="center",
                    color="white" if matrix[ia, ib] < 0.6 else "black",
                    fontsize=9,
                )
        ax.set_xticks(range(len(families)), families)
        ax.set_yticks(range(len(families)), families)
        ax.set_title(f"|cos| of C rows — {_short(model)}")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    _save(fig, path)


def plot_random_reference(
    path: Path,
    samples: np.ndarray,
    M: int,
    K: int,
    p95: float,
    p99: float,  # noqa: N803
    value: float | None = None,
    percentile: float | None = None,
) -> None:
    _style()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    ax.hist(100 * samples, bins=80, color="#9dc3e6", edgecolor="#1f4e79", linewidth=0.3)
    ax.axvline(100 / M, color="grey", ls=":", lw=1.2, label=f"1/M bound = {100 / M:.1f}%")
    ax.axvline(100 * p95, color="#548235", ls="--", lw=1.2, label=f"p95 = {100 * p95:.1f}%")
    ax.axvline(100 * p99, color="#7030a0", ls="--", lw=1.2, label=f"p99 = {100 * p99:.1f}%")
    if value is not None:
        ax.axvline(
            100 * value,
            color="#c00000",
            lw=2.2,
            label=f"measured = {100 * value:.1f}% (percentile {percentile:.1f})",
        )
    ax.set_xlabel("B_shared of an i.i.d. Gaussian M × K matrix (%)")
    ax.set_ylabel("trials")
    ax.set_title(f"Random reference: M = {M}, K = {K}, {len(samples):,} trials")
    ax.legend(frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    _save(fig, path)
