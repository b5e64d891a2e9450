"""Figures of the noise checks (kept apart from plots.py, which is near its size limit).

- ``plot_nsweep``: plain and noise-corrected B_shared(C) against the probe size n (log
  axis), mean ± SE over seeds with the per-seed values as faint points, one panel per
  model, and the 1/M floor.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from cdscope.output.plots import PALETTE, new_axes, save_figure, short_label, styled

SERIES = {
    "B_shared_C": ("plain B_shared(C)", "-", "o"),
    "B_shared_C_unbiased": ("corrected (unbiased Gram)", "--", "s"),
}


@styled
def nsweep_figure(per_seed: pd.DataFrame, summary: pd.DataFrame, M: int) -> Figure:  # noqa: N803
    """The n-sweep figure (module doc); values in percent."""
    models = list(dict.fromkeys(per_seed["model"]))
    fig, axes = new_axes(1, len(models), (6.4 * len(models), 4.4))
    ns = sorted(per_seed["n"].unique())
    for ax, model in zip(axes[0], models, strict=True):
        for i, (measure, (label, style, marker)) in enumerate(SERIES.items()):
            rows = summary[(summary["model"] == model) & (summary["measure"] == measure)]
            seeds = per_seed[(per_seed["model"] == model) & (per_seed["measure"] == measure)]
            if rows.empty:
                continue
            jitter = 1.0 + (i - 0.5) * 0.06
            ax.scatter(seeds["n"] * jitter, 100 * seeds["value"], s=10, alpha=0.25,
                       color=PALETTE[i], linewidths=0)  # fmt: skip
            n_seeds = int(rows["n_seeds"].max())
            ax.errorbar(rows["n"] * jitter, 100 * rows["mean"], yerr=100 * rows["se"].fillna(0),
                        color=PALETTE[i], linestyle=style, marker=marker, capsize=3,
                        label=f"{label}, mean ± SE ({n_seeds} seeds)")  # fmt: skip
        ax.axhline(100 / M, color="grey", linestyle=":", linewidth=1)
        ax.text(ns[0], 100 / M, f" 1/M = {100 / M:.1f}%", va="bottom", fontsize=8, color="grey")
        ax.set_xscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("probe samples per family n")
        ax.set_ylabel("B_shared(C) (%)")
        ax.set_title(
            f"{short_label(str(model), 40)}: B_shared against n\n"
            "(plain and corrected estimate different quantities: not comparable)"
        )
        ax.legend(fontsize=8, loc="lower right")
        ax.grid(alpha=0.3)
    return fig


def plot_nsweep(path: Path, per_seed: pd.DataFrame, summary: pd.DataFrame, M: int) -> Path:  # noqa: N803
    """``nsweep_figure`` written to ``path``."""
    return save_figure(nsweep_figure(per_seed, summary, M), path)


__all__ = ["nsweep_figure", "plot_nsweep"]
