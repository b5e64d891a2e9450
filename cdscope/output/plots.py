"""Figures readable at paper size (matplotlib without pyplot; PNG, PDF or SVG, atomic writes).

Every figure is a ``NotebookFigure`` built by a ``*_figure`` function and returned, so a
notebook shows it (``_repr_png_``) and a script can change or save it; the ``plot_*``
functions write one to a path. No figure goes through pyplot: nothing switches the
caller's backend, registers a global figure or draws twice in a notebook, and the style
(``STYLE``) applies inside ``styled`` only, never to the caller's rcParams.

- ``audit_figure``: per-model bars (mean ± SE over seeds) with per-seed points for the
  headline measures, plus a forest plot of same-seed paired deltas (95% t-interval)
  when there are several models.
- ``decompose_figure``: B_shared, B_dir, B_norm side by side, and the |cos| matrix of
  family rows (mean over seeds) per model.
- ``random_reference_figure``: histogram of the random-reference B_shared with the
  measured value and the 95th/99th percentiles marked.
- ``passk_figure``: pass@k against k, one panel per domain plus overall, one line per model.

Given ``ax=`` (an Axes of the caller's figure), the audit, decompose and random-reference
figures draw their first panel there and return the caller's figure.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from cdscope.io import atomic_write_bytes, check_plot_path
from cdscope.output.render import LABELS, measure_name, negatives

PALETTE = ["#1f4e79", "#c55a11", "#548235", "#7030a0", "#bf9000", "#2e75b6", "#a50021"]
MARKERS = ("o", "s", "^", "D", "v")
STYLE = {
    "font.size": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
}
F = TypeVar("F", bound=Callable[..., Any])


class NotebookFigure(Figure):
    """A matplotlib Figure made without pyplot that a notebook shows as a PNG."""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
        return buffer.getvalue()


def styled(draw: F) -> F:
    """Run ``draw`` under ``STYLE`` (matplotlib.rc_context): the caller's rcParams stay."""

    @functools.wraps(draw)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with matplotlib.rc_context(STYLE):
            return draw(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def new_figure(figsize: tuple[float, float], layout: str | None = "constrained") -> Figure:
    """An empty ``NotebookFigure`` (constrained layout: titles, labels and colour bars
    keep their room)."""
    return NotebookFigure(figsize=figsize, layout=layout)


def new_axes(
    nrows: int, ncols: int, figsize: tuple[float, float], **kwargs: Any
) -> tuple[Figure, np.ndarray]:
    """A ``NotebookFigure`` and its [nrows, ncols] array of Axes (``Figure.subplots``
    with ``kwargs``; ``layout`` goes to the figure)."""
    fig = new_figure(figsize, kwargs.pop("layout", "constrained"))
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kwargs)


def save_figure(fig: Figure, path: Path) -> Path:
    """Write ``fig`` to ``path`` atomically (format from the suffix: png, pdf, svg)."""
    fmt = check_plot_path(path)
    atomic_write_bytes(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=200, bbox_inches="tight"))
    return Path(path)


def short_label(name: str, width: int = 22) -> str:
    """A model name for figure text; ``$`` escaped so mathtext shows it as typed."""
    from cdscope.output.render import short_model_name

    name = short_model_name(name)
    name = name if len(name) <= width else "…" + name[-(width - 1) :]
    return name.replace("$", r"\$")


#: what the bars of a plain measure and its noise-corrected twin say, when both are drawn:
#: which one is the paper's (and the random reference's) quantity
TWIN_NOTES = {
    "B_shared_C": "plain: the paper's",
    "B_shared_C_unbiased": "not comparable\nwith plain",
}
#: the measure the random-reference band is drawn under (SPEC §4: B_shared of Gaussian rows)
RANDOM_MEASURE = "B_shared_C"


@dataclass(frozen=True)
class BarMarks:
    """What is drawn over the bars besides the measurements: per model the random
    reference of its M x K (``bands``: model -> (mean, p95, 'M x K'), fractions) under the
    plain B_shared(C) bars, and the ``--fail-above`` threshold (percent) over the
    ``gated`` measure's bars."""

    bands: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    fail_above: float | None = None
    gated: str = RANDOM_MEASURE


def _marks(ax: Axes, x: float, width: float, model: str, measure: str, marks: BarMarks) -> None:
    """The random-reference band and the --fail-above line at one bar (labelled once)."""
    if measure == RANDOM_MEASURE and model in marks.bands:
        mean, p95, shape = marks.bands[model]
        labels = ax.get_legend_handles_labels()[1]
        label = f"random {shape} matrix: mean–p95"
        ax.fill_between([x - width / 2, x + width / 2], 100 * mean, 100 * p95, facecolor="#d0d0d0",
                        alpha=0.85, hatch="///", edgecolor="#404040", lw=0, zorder=2.5,
                        label=None if label in labels else label)  # fmt: skip
    if measure == marks.gated and marks.fail_above is not None:
        labels = ax.get_legend_handles_labels()[1]
        label = f"--fail-above {marks.fail_above:g}%"
        ax.hlines(marks.fail_above, x - width / 2, x + width / 2, color="#a50021", ls="--",
                  lw=1.6, zorder=4, label=None if label in labels else label)  # fmt: skip


def _bars(
    ax: Axes,
    per_seed: pd.DataFrame,
    summary: pd.DataFrame,
    measures: list[str],
    models: list[str],
    marks: BarMarks = BarMarks(),  # noqa: B008 - frozen, never mutated
) -> None:
    """Grouped bars: one group per measure, one bar per model, per-seed points on top,
    ``marks`` over them; the legend (models, marks) outside the axes, where no bar or
    point can lie under it."""
    width = 0.8 / len(models)
    rng = np.random.default_rng(0)
    for i, model in enumerate(models):
        for j, measure in enumerate(measures):
            row = summary[(summary["model"] == model) & (summary["measure"] == measure)]
            if row.empty:
                continue
            x = j + (i - (len(models) - 1) / 2) * width
            _marks(ax, x, width * 0.9, model, measure, marks)
            mean, se = 100 * float(row["mean"].iloc[0]), 100 * float(row["se"].iloc[0])
            ax.bar(
                x,
                mean,
                width * 0.9,
                color=PALETTE[i % len(PALETTE)],
                alpha=0.55,
                label=short_label(model) if j == 0 else None,
            )
            if not np.isnan(se):  # one seed: no SE, no whisker
                ax.errorbar(x, mean, yerr=se, color="black", capsize=4, lw=1.2)
            seeds = (
                100
                * per_seed[(per_seed["model"] == model) & (per_seed["measure"] == measure)]["value"]
            )
            spread = width * 0.25 if len(seeds) > 1 else 0.0
            jitter = rng.uniform(-spread, spread, len(seeds))
            ax.scatter(
                x + jitter,
                seeds,
                s=14,
                color=PALETTE[i % len(PALETTE)],
                edgecolor="black",
                linewidth=0.5,
                zorder=3,
            )
    twins = set(TWIN_NOTES) <= set(measures)  # plain beside corrected: say which is which
    ticks = [LABELS.get(m, m) + (f"\n{TWIN_NOTES[m]}" if twins and m in TWIN_NOTES else "")
             for m in measures]  # fmt: skip
    ax.set_xticks(range(len(measures)), ticks, fontsize=9 if twins else None)
    several = per_seed.groupby("model")["seed"].nunique().max() > 1
    ax.set_ylabel(
        "percent (mean ± SE over seeds, dots = seeds)" if several else "percent (one seed)"
    )
    ax.axhline(0, color="grey", lw=0.6)
    ax.legend(frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _forest(ax: Axes, paired: pd.DataFrame, measures: list[str]) -> None:
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
        measure = measure_name(row["measure"])
        labels.append(f"{short_label(row['model'], 18)}\n{measure}  ({negatives(row)} < 0)")
    ax.axvline(0, color="grey", lw=1, ls="--")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # top to bottom, no empty band for few rows
    reference = short_label(str(paired["reference"].iloc[0])) if len(paired) else ""
    ax.set_xlabel(f"Δ vs {reference} (percentage points, 95% t-interval)")
    ax.set_title("Same-seed paired differences")


def _seeds_title(summary: pd.DataFrame) -> str:
    n_seeds = int(summary["n_seeds"].max()) if len(summary) else 0
    return f"{n_seeds} seed{'' if n_seeds == 1 else 's'}"


@styled
def audit_figure(
    title: str,
    per_seed: pd.DataFrame,
    summary: pd.DataFrame,
    paired: pd.DataFrame,
    measures: list[str],
    ax: Axes | None = None,
    marks: BarMarks = BarMarks(),  # noqa: B008 - frozen, never mutated
) -> Figure:
    """Bars of ``measures`` per model with ``marks`` (random-reference band, --fail-above
    line) and, with several models, the forest of paired deltas beside them (``ax``: the
    bars only, on the caller's Axes)."""
    models = list(dict.fromkeys(per_seed["model"]))
    measures = [m for m in measures if (summary["measure"] == m).any()]
    several = len(models) > 1 and not paired.empty and ax is None
    if ax is None:
        fig, axes = new_axes(
            1, 2 if several else 1, (12 if several else 6.5, 4.2),
            **({"width_ratios": [1.1, 1]} if several else {}),
        )  # fmt: skip
        ax = axes[0, 0]
    _bars(ax, per_seed, summary, measures, models, marks)
    ax.set_title(f"{title} — {_seeds_title(summary)}")
    if several:
        _forest(axes[0, 1], paired, measures)
    return ax.figure


@styled
def decompose_figure(
    per_seed: pd.DataFrame,
    summary: pd.DataFrame,
    measures: list[str],
    title: str,
    ax: Axes | None = None,
) -> Figure:
    """Bars of ``measures`` (B_shared, B_dir, B_norm) under ``title`` and one |cos| heatmap
    of C's rows per model (``ax``: the bars only)."""
    models = list(dict.fromkeys(per_seed["model"]))
    if ax is not None:
        _bars(ax, per_seed, summary, measures, models)
        ax.set_title(f"{title} — {_seeds_title(summary)}")
        return ax.figure
    fig, axes = new_axes(1, 1 + len(models), (6.5 + 3.8 * len(models), 4.2))
    _bars(axes[0, 0], per_seed, summary, measures, models)
    axes[0, 0].set_title(f"{title} — {_seeds_title(summary)}")
    for i, model in enumerate(models):
        ax = axes[0, i + 1]
        cos = summary[(summary["model"] == model) & (summary["measure"] == "abs_cos")]
        pairs = list(zip(cos["family"], cos["family_b"], strict=True))
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
        ax.set_title(f"|cos| of C rows — {short_label(model)}")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    return fig


@styled
def random_reference_figure(
    samples: np.ndarray,
    M: int,  # noqa: N803
    K: int,  # noqa: N803
    p95: float,
    p99: float,
    value: float | None = None,
    percentile: float | None = None,
    ax: Axes | None = None,
) -> Figure:
    """The histogram of random-matrix B_shared with 1/M, p95, p99 and ``value`` marked."""
    if ax is None:
        _, axes = new_axes(1, 1, (9.5, 4))  # room for the legend
        ax = axes[0, 0]
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
    return ax.figure


#: panels per row of the pass@k figure
PASSK_COLUMNS = 4
#: how far apart (in log2 k) the points of successive models are drawn, so that models
#: with equal pass@k stay visible side by side instead of one line hiding the other
PASSK_DODGE = 0.06


def passk_panels(passk: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows) of each panel of the pass@k figure (SPEC §7): every benchmark, each
    domain's mean after its benchmarks when it has several (with one, the benchmark is the
    domain), then overall."""
    rows = passk[passk["subset"] == "all"]
    panels = []
    for domain in sorted(rows.loc[rows["level"] == "domain", "domain"].unique()):
        benches = rows[(rows["level"] == "benchmark") & (rows["domain"] == domain)]
        names = sorted(benches["benchmark"].unique())
        panels += [(name, benches[benches["benchmark"] == name]) for name in names]
        if len(names) > 1:
            part = rows[(rows["level"] == "domain") & (rows["domain"] == domain)]
            panels.append((f"{domain} (mean of {len(names)})", part))
    return [*panels, ("overall", rows[rows["level"] == "overall"])]


@styled
def passk_figure(passk: pd.DataFrame, models: list[str] | None = None) -> Figure:
    """pass@k against k (SPEC §7): one panel per benchmark, domain mean and overall
    (``passk_panels``), one line per model (in the order of ``models``, default: as they
    appear), each model's points shifted by ``PASSK_DODGE`` so equal curves stay visible."""
    panels = passk_panels(passk)
    models = models or list(dict.fromkeys(passk["model"]))
    columns = min(PASSK_COLUMNS, len(panels))
    nrows = -(-len(panels) // columns)
    fig, axes = new_axes(nrows, columns, (3.4 * columns, 3.1 * nrows))
    for ax, (title, part) in zip(axes.flat, panels, strict=False):
        for i, model in enumerate(models):
            line = part[part["model"] == model].sort_values("k")
            shift = 2.0 ** (PASSK_DODGE * (i - (len(models) - 1) / 2))
            ax.plot(
                line["k"] * shift,
                100 * line["pass_at_k"],
                marker=MARKERS[i % len(MARKERS)],
                markersize=8 - 2 * (i % 3),  # later models drawn smaller: equal curves stay visible
                linestyle=("-", "--", ":")[i % 3],
                color=PALETTE[i % len(PALETTE)],
                label=short_label(model),
            )
        problems = int(part["problems"].max()) if len(part) else 0
        ax.set_title(f"{title} ({problems} problem{'' if problems == 1 else 's'})", fontsize=9)
        ax.set_xscale("log", base=2)
        ks = sorted(part["k"].unique())
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.set_xlabel("k")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("pass@k (%)")
    axes.flat[len(panels) - 1].legend(loc="best", fontsize=8, frameon=False)
    return fig


def plot_passk(path: Path, passk: pd.DataFrame, models: list[str] | None = None) -> Path:
    """``passk_figure`` written to ``path``."""
    return save_figure(passk_figure(passk, models), path)
