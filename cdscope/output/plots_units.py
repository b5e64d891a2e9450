"""Figures of C at unit granularity (heads, experts, neurons; docs/granularity.md).

``plot_units`` draws, per model:

- the cumulative |C| mass curve of each family (``spectral.cumulative_mass``: the share
  of sum_k |C[m, k]| carried by its j largest-|C| gates against j / K, log x, mean over
  seeds), with each family's participation ratio in the legend;
- where the gate set has attention heads, one layer x head heatmap of C per family
  (mean over seeds, diverging colour scale centred at 0, shared by the family panels).

Any granularity works (at sublayer the curve has K = 2L points and there is no heatmap).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from cdscope.analysis import spectral
from cdscope.output.frames import control_matrices
from cdscope.output.plots import PALETTE, new_axes, save_figure, short_label, styled


def _curves(frame: pd.DataFrame, model: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Families, their mean mass curve [M, K] and mean PR [M] over the model's seeds."""
    mats = [(f, C) for (m, _), (f, C) in control_matrices(frame).items() if m == model]
    families = mats[0][0]
    same = [C for f, C in mats if f == families]
    curves = np.mean([spectral.cumulative_mass(C) for C in same], axis=0)
    prs = np.mean([spectral.participation_ratio(C) for C in same], axis=0)
    return families, curves, prs


def head_grid(frame: pd.DataFrame, model: str) -> dict[str, np.ndarray]:
    """Per family: mean over seeds of C of the attention-head gates as [layers, heads]."""
    rows = frame[
        (frame["model"] == model)
        & ~frame["dropped"].astype(bool)
        & (frame["sublayer"] == "attn")
        & frame["unit"].notna()
    ]
    out = {}
    for family, part in rows.groupby("family", sort=True):
        mean = part.groupby(["layer", "unit"])["C"].mean().unstack("unit").sort_index()
        out[str(family)] = mean.to_numpy(dtype=float)
    return out


@styled
def units_figure(frame: pd.DataFrame) -> Figure:
    """Mass curves and layer x head heatmaps of C, one row of panels per model."""
    models = list(dict.fromkeys(frame["model"]))
    grids = {m: head_grid(frame, m) if "unit" in frame.columns else {} for m in models}
    columns = 1 + max(len(g) for g in grids.values())
    fig, axes = new_axes(len(models), columns, (4.2 * columns, 3.6 * len(models)))
    for row, model in enumerate(models):
        families, curves, prs = _curves(frame, model)
        K = curves.shape[1]  # noqa: N806
        ax = axes[row, 0]
        x = np.arange(1, K + 1) / K
        for i, (family, pr) in enumerate(zip(families, prs, strict=True)):
            ax.plot(x, curves[i], color=PALETTE[i % len(PALETTE)], label=f"{family} (PR {pr:,.0f})")
        ax.set_xscale("log")
        ax.set_xlim(1 / K, 1)
        ax.set_ylim(0, 1.02)
        ax.axvline(0.01, color="0.6", lw=0.8, ls=":")
        ax.set_xlabel(f"fraction of the {K:,} gates (largest |C| first)")
        ax.set_ylabel("share of Σ|C|")
        ax.set_title(f"{short_label(model)}: cumulative |C| mass", fontsize=10)
        ax.legend(frameon=False, fontsize=8, loc="lower right")
        grid = grids[model]
        scale = max((np.nanmax(np.abs(g)) for g in grid.values()), default=1.0) or 1.0
        image = None
        for col, (family, values) in enumerate(grid.items(), start=1):
            ax = axes[row, col]
            image = ax.imshow(
                values, cmap="RdBu_r", vmin=-scale, vmax=scale, aspect="auto",
                interpolation="nearest", origin="lower",
            )  # fmt: skip
            ax.set_xlabel("head")
            ax.set_ylabel("layer" if col == 1 else "")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(f"C per head: {family}", fontsize=10)
        for col in range(1 + len(grid), columns):
            axes[row, col].axis("off")
        if image is not None:
            fig.colorbar(image, ax=list(axes[row, 1 : 1 + len(grid)]), shrink=0.85, label="C")
    return fig


def plot_units(path: Path, frame: pd.DataFrame) -> Path:
    """``units_figure`` written to ``path``."""
    return save_figure(units_figure(frame), path)
