"""The eap-info figure (SPEC §6): mean |edge score| heatmaps and per-sample statistics.

- one heatmap per model of log10 mean |s(u -> v)| over the verified samples, upstream
  writes as rows (the embedding, then each layer's writes in gate order) and downstream
  reading paths as columns (each layer's paths: an attention's q, k, v, an MLP's input;
  the last column the logits), on a colour scale shared by the models; every layer is
  labelled on both axes, at the middle of its block of rows or columns, and thin lines
  separate the layers;
- one panel per statistic (intensity, information complexity, kurtosis): each sample's
  value as a dot (a sample's two values joined when there is a baseline) and the mean
  with its percentile-bootstrap 95 % interval as a diamond with whiskers; a legend
  under the panels says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from cdscope.output.plots import PALETTE, new_figure, save_figure, short_label, styled

EAP_LABELS = {
    "intensity": "intensity = mean |s_e|",
    "info_complexity": "information complexity = H(p) / log E",
    "kurtosis": "kurtosis of |s_e| (Pearson)",
}


def _layer(node: str) -> str:
    """'attn12' -> '12', "mlp3'" -> '3', 'emb' / 'logits' -> ''."""
    return re.sub(r"\D", "", node)


def layer_ticks(nodes: list[str]) -> tuple[list[float], list[str], list[float]]:
    """Tick positions and labels for rows or columns named by ``nodes``: one tick per
    layer at the middle of its block (labelled with the layer number), one for every
    node outside the layers (emb, logits, labelled by name), and the block boundaries."""
    ticks: list[float] = []
    labels: list[str] = []
    bounds: list[float] = []
    start = 0
    for i in range(1, len(nodes) + 1):
        if i < len(nodes) and _layer(nodes[i]) == _layer(nodes[start]):
            continue
        layer = _layer(nodes[start])
        ticks.append((start + i - 1) / 2)
        labels.append(layer if layer else nodes[start])
        if i < len(nodes):
            bounds.append(i - 0.5)
        start = i
    return ticks, labels, bounds


def _block_order(names: list[str]) -> str:
    """What one layer's block holds, in order: 'attn q, attn k, attn v, mlp in'."""
    first = [n for n in names if _layer(n) == "0"] or names[:1]
    return ", ".join(re.sub(r"\d+'*", "", n).replace(".", " ") for n in first)


def _edge_heatmap(
    ax: Axes, fig: Figure, matrix: np.ndarray, graph: Any, title: str, limits: tuple[float, float]
) -> None:
    """log10 |mean edge score|: upstream writes (rows) x downstream reading paths (columns)."""
    cmap = matplotlib.colormaps["magma"].with_extremes(bad="#eeeeee")  # grey: no such edge
    image = ax.imshow(
        np.log10(matrix), aspect="auto", cmap=cmap, vmin=limits[0], vmax=limits[1],
        interpolation="nearest",
    )  # fmt: skip
    columns = [node for node, _ in graph.consumers]
    xt, xl, xb = layer_ticks(columns)
    yt, yl, yb = layer_ticks(list(graph.upstream))
    size = 7 if graph.num_layers > 16 else 8
    ax.set_xticks(xt, xl, fontsize=size)
    ax.set_yticks(yt, yl, fontsize=size)
    ax.tick_params(length=2, pad=1)
    for x in xb:
        ax.axvline(x, color="white", lw=0.4, alpha=0.6)
    for y in yb:
        ax.axhline(y, color="white", lw=0.4, alpha=0.6)
    ax.set_xlabel(
        f"downstream: layer, reading paths per layer ({_block_order(graph.consumer_names)}); "
        "last column: the logits"
    )
    ax.set_ylabel(f"upstream: layer, writes per layer ({_block_order(list(graph.upstream))})")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01, label="log10 mean |s(u → v)|")


def _stat_strip(
    ax: Axes, per_sample: pd.DataFrame, summary: pd.DataFrame, key: str, models: list[str]
) -> None:
    """Per-sample values (dots, paired samples joined) with the mean and its 95% interval."""
    values = per_sample.pivot(index="sample_id", columns="model", values=key)
    jitter = np.random.default_rng(0).uniform(-0.08, 0.08, len(values))
    if len(models) == 2:  # join each sample's two values
        for j, (va, vb) in enumerate(zip(values[models[0]], values[models[1]], strict=True)):
            ax.plot([jitter[j], 1 + jitter[j]], [va, vb], color="grey", lw=0.5, alpha=0.5)
    for i, model in enumerate(models):
        ax.scatter(
            i + jitter, values[model], s=16, color=PALETTE[i % len(PALETTE)], alpha=0.7,
            edgecolor="black", linewidth=0.4, zorder=3,
        )  # fmt: skip
        row = summary[(summary["model"] == model) & (summary["statistic"] == key)].iloc[0]
        ax.errorbar(
            i + 0.22, row["mean"], yerr=[[row["mean"] - row["boot_low"]], [row["boot_high"] - row["mean"]]],
            fmt="D", color="black", capsize=4, ms=5,
        )  # fmt: skip
    ax.set_xticks(range(len(models)), [short_label(m, 16) for m in models], fontsize=8)
    ax.set_xlim(-0.5, len(models) - 0.5)
    ax.set_title(EAP_LABELS[key])


def _whisker_legend(fig: Figure, summary: pd.DataFrame, paired: bool) -> None:
    """What the dots, lines and whiskers of the statistic panels are."""
    resamples = int(summary["B"].iloc[0]) if "B" in summary and len(summary) else 2000
    handles = [
        Line2D([], [], ls="", marker="o", color="grey", mec="black", mew=0.4, label="one sample"),
        Line2D([], [], ls="-", marker="D", color="black", ms=5,
               label=f"mean, whiskers: 95% percentile-bootstrap interval ({resamples:,} resamples)"),
    ]  # fmt: skip
    if paired:
        handles.insert(1, Line2D([], [], color="grey", lw=0.8, label="the same sample"))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), frameon=False)


@styled
def eap_figure(
    graph: Any, edges: pd.DataFrame, per_sample: pd.DataFrame, summary: pd.DataFrame
) -> Figure:
    """Mean |edge score| heatmap per model (shared log colour scale) and per-sample
    statistics (module doc)."""
    models = list(dict.fromkeys(per_sample["model"]))
    matrices = {
        m: graph.matrix(edges[edges["model"] == m]["mean_abs_score"].to_numpy()) for m in models
    }
    logs = np.log10(np.concatenate([x[np.isfinite(x) & (x > 0)] for x in matrices.values()]))
    limits = (float(np.quantile(logs, 0.02)), float(logs.max()))  # keep ~0 edges from washing out
    fig = new_figure((13, 5.6 * len(models) + 3.6))
    grid = fig.add_gridspec(len(models) + 1, 3, height_ratios=[5.6] * len(models) + [3.0])
    n = int(per_sample.groupby("model").size().max())
    for i, model in enumerate(models):
        title = (
            f"{short_label(model, 40)}: mean |edge score| over {n} sample(s), "
            f"{graph.E:,} edges, L = {graph.num_layers}"
        )
        _edge_heatmap(fig.add_subplot(grid[i, :]), fig, matrices[model], graph, title, limits)
    for j, key in enumerate(("intensity", "info_complexity", "kurtosis")):
        _stat_strip(fig.add_subplot(grid[len(models), j]), per_sample, summary, key, models)
    _whisker_legend(fig, summary, len(models) == 2)
    return fig


def plot_eap(
    path: Path, graph: Any, edges: pd.DataFrame, per_sample: pd.DataFrame, summary: pd.DataFrame
) -> Path:
    """``eap_figure`` written to ``path``."""
    return save_figure(eap_figure(graph, edges, per_sample, summary), path)
