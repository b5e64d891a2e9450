"""How concentrated edge-level control is: the PR / cumulative |C| mass figure (issue 15).

One row of panels per model:

- left: cumulative share of sum_e |C[m, e]| carried by the top-r edges against r (log
  scale, 1 .. E), one curve per family (mean of the per-seed curves), the 50% and 90%
  levels dashed, the legend giving each family's mean number of edges to reach them;
- right: the participation ratio PR(C[m, :]) of each family (SPEC §3; 1 = one edge
  carries the row, E = all equal): bar = mean over seeds, dots = seeds, with PR / E.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from cdscope.analysis.spectral import cumulative_mass
from cdscope.output.frames import control_matrices
from cdscope.output.plots import PALETTE, new_axes, save_figure, short_label, styled


def _mass_curves(frame: pd.DataFrame, model: str) -> dict[str, np.ndarray]:
    """family -> mean over seeds of the cumulative |C| share of the top-r edges, r = 1 .. E."""
    curves: dict[str, list[np.ndarray]] = {}
    for (name, _), (families, C) in control_matrices(frame).items():
        if name != model:
            continue
        for family, row in zip(families, cumulative_mass(C), strict=True):
            curves.setdefault(family, []).append(row)
    return {family: np.mean(rows, axis=0) for family, rows in sorted(curves.items())}


@styled
def edge_concentration_figure(frame: pd.DataFrame, table: pd.DataFrame) -> Figure:
    """The figure of an edge-granularity probe ``frame`` and its per-(model, seed, family)
    ``table`` of E and PR (``cdscope.commands.edge_control.concentration``)."""
    models = list(dict.fromkeys(table["model"]))
    fig, axes = new_axes(len(models), 2, (11, 3.8 * len(models)))
    for (mass_ax, pr_ax), model in zip(axes, models, strict=True):
        rows = table[table["model"] == model]
        E = int(rows["E"].iloc[0])  # noqa: N806
        families = sorted(rows["family"].unique())
        colors = {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(families)}
        counts = rows.groupby("family")[["edges_50", "edges_90"]].mean()
        for family, curve in _mass_curves(frame, model).items():
            e50, e90 = counts.loc[family]
            label = f"{family}: 50% in {e50:.0f}, 90% in {e90:.0f} edges"
            mass_ax.plot(np.arange(1, E + 1), curve, color=colors[family], label=label)
        for q in (0.5, 0.9):
            mass_ax.axhline(q, color="0.6", linestyle="--", linewidth=0.8)
        mass_ax.set(
            xscale="log",
            xlim=(1, E),
            ylim=(0, 1.02),
            xlabel=f"top-r edges (of E = {E})",
            ylabel="share of sum |C|",
            title=f"{short_label(model)}: cumulative |C| mass",
        )
        mass_ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(0, 0.88))
        means = rows.groupby("family")["PR"].mean().reindex(families)
        x = np.arange(len(families))
        pr_ax.bar(x, means.to_numpy(), color=[colors[f] for f in families], alpha=0.6)
        for i, family in enumerate(families):
            seeds = rows.loc[rows["family"] == family, "PR"].to_numpy()
            pr_ax.scatter(np.full(len(seeds), i), seeds, color="k", s=10, zorder=3)
            pr_ax.annotate(
                f"{means[family] / E:.1%}",
                (i, means[family]),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        pr_ax.set_xticks(x, families, rotation=30, ha="right")
        pr_ax.set(ylabel="participation ratio (edges)", title=f"PR of C rows (E = {E})")
    return fig


def plot_edge_concentration(path: Path, frame: pd.DataFrame, table: pd.DataFrame) -> Path:
    """``edge_concentration_figure`` written to ``path``."""
    return save_figure(edge_concentration_figure(frame, table), path)
