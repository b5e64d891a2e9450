"""Figures readable at paper size (matplotlib, Agg backend, PNG or PDF, atomic writes).

- ``plot_audit``: per-model bars (mean ± SE over seeds) with per-seed points for the
  headline measures, plus a forest plot of same-seed paired deltas (95% t-interval)
  when there are several models.
- ``plot_decompose``: B_shared, B_dir, B_norm side by side, and the |cos| matrix of
  family rows (mean over seeds) per model.
- ``plot_random_reference``: histogram of the random-reference B_shared with the
  measured value and the 95th/99th percentiles marked.
- ``plot_passk``: pass@k against k, one panel per domain plus overall, one line per model.
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


def save_figure(fig: plt.Figure, path: Path) -> None:
    fmt = check_plot_path(path)
    atomic_write_bytes(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=200, bbox_inches="tight"))
    plt.close(fig)


MARKERS = ("o", "s", "^", "D", "v")


def short_label(name: str, width: int = 22) -> str:
    """A model name for figure text; ``$`` escaped so mathtext shows it as typed."""
    from cdscope.output.render import short_model_name

    name = short_model_name(name)
    name = name if len(name) <= width else "…" + name[-(width - 1) :]
    return name.replace("$", r"\$")


def apply_style() -> None:
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
                label=short_label(model) if j == 0 else None,
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
            f"{short_label(row['model'], 18)}\n{LABELS.get(row['measure'], row['measure'])}  "
            f"({row['n_negative']}/{row['n']} < 0)"
        )
    ax.axvline(0, color="grey", lw=1, ls="--")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)  # top to bottom, no empty band for few rows
    reference = short_label(str(paired["reference"].iloc[0])) if len(paired) else ""
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
    apply_style()
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
    save_figure(fig, path)


def plot_decompose(path: Path, per_seed: pd.DataFrame, summary: pd.DataFrame) -> None:
    apply_style()
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
        ax.set_title(f"|cos| of C rows — {short_label(model)}")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    save_figure(fig, path)


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
    apply_style()
    fig, ax = plt.subplots(figsize=(9.5, 4))  # room for the legend beside the axes
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
    save_figure(fig, path)


def _layer_ticks(names: list[str], prefix: str, L: int) -> tuple[list[int], list[str]]:  # noqa: N803
    """Every name when there are few; else the first name of every few layers (~8 labels)."""
    if len(names) <= 32:
        return list(range(len(names))), list(names)
    step = max(1, int(np.ceil(L / 8)))
    first = step if "emb" in names else 0  # emb and attn0 are neighbours: label one
    wanted = {f"{prefix}{i}" for i in range(first, L, step)} | {"emb", "logits"}
    picks = [(i, n) for i, n in enumerate(names) if n.split(".")[0] in wanted]
    seen, ticks, labels = set(), [], []
    for i, name in picks:
        node = name.split(".")[0]
        if node not in seen:
            seen.add(node)
            ticks.append(i)
            labels.append(name)
    return ticks, labels


def _edge_heatmap(
    ax: plt.Axes,
    fig: plt.Figure,
    matrix: np.ndarray,
    graph,
    title: str,
    limits: tuple[float, float],
) -> None:  # noqa: ANN001
    """log10 |mean edge score| matrix: upstream node (rows) x downstream path (columns)."""
    cmap = plt.get_cmap("magma").with_extremes(bad="#eeeeee")  # grey: no such edge
    image = ax.imshow(
        np.log10(matrix),
        aspect="auto",
        cmap=cmap,
        vmin=limits[0],
        vmax=limits[1],
        interpolation="nearest",
    )
    L = graph.num_layers  # noqa: N806
    xt, xl = _layer_ticks(graph.consumer_names, "attn", L)
    yt, yl = _layer_ticks(list(graph.upstream), "attn", L)
    ax.set_xticks(xt, xl, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(yt, yl, fontsize=8)
    layer_of = [re.sub(r"\D", "", node) for node, _ in graph.consumers]
    for i in range(1, len(layer_of)):  # layer boundaries: the first path of each block
        if layer_of[i] != layer_of[i - 1]:
            ax.axvline(i - 0.5, color="white", lw=0.3, alpha=0.5)
    ax.set_xlabel("downstream node . path (q/k/v or q/kv into attention, in = other inputs)")
    ax.set_ylabel("upstream node (writes)")
    ax.set_title(title)
    fig.colorbar(image, ax=ax, fraction=0.025, pad=0.01, label="log10 mean |s(u → v)|")


def _stat_strip(
    ax: plt.Axes, per_sample: pd.DataFrame, summary: pd.DataFrame, key: str, models: list[str]
) -> None:
    """Per-sample values (dots, paired samples joined) with the mean and its 95% interval."""
    values = per_sample.pivot(index="sample_id", columns="model", values=key)
    jitter = np.random.default_rng(0).uniform(-0.08, 0.08, len(values))
    if len(models) == 2:  # join each sample's two values
        for j, (va, vb) in enumerate(zip(values[models[0]], values[models[1]], strict=True)):
            ax.plot([jitter[j], 1 + jitter[j]], [va, vb], color="grey", lw=0.5, alpha=0.5)
    for i, model in enumerate(models):
        ax.scatter(
            i + jitter,
            values[model],
            s=16,
            color=PALETTE[i % len(PALETTE)],
            alpha=0.7,
            edgecolor="black",
            linewidth=0.4,
            zorder=3,
        )
        row = summary[(summary["model"] == model) & (summary["statistic"] == key)].iloc[0]
        ax.errorbar(
            i + 0.22,
            row["mean"],
            yerr=[[row["mean"] - row["ci_low"]], [row["ci_high"] - row["mean"]]],
            fmt="D",
            color="black",
            capsize=4,
            ms=5,
        )
    ax.set_xticks(range(len(models)), [short_label(m, 16) for m in models], fontsize=8)
    ax.set_xlim(-0.5, len(models) - 0.5)
    ax.set_title(EAP_LABELS[key])


EAP_LABELS = {
    "intensity": "intensity = mean |s_e|",
    "info_complexity": "information complexity = H(p) / log E",
    "kurtosis": "kurtosis of |s_e| (Pearson)",
}


def plot_eap(
    path: Path,
    graph,
    edges: pd.DataFrame,
    per_sample: pd.DataFrame,  # noqa: ANN001
    summary: pd.DataFrame,
) -> None:
    """Mean |edge score| heatmap per model (shared log colour scale) and per-sample statistics."""
    apply_style()
    models = list(dict.fromkeys(per_sample["model"]))
    matrices = {
        m: graph.matrix(edges[edges["model"] == m]["mean_abs_score"].to_numpy()) for m in models
    }
    logs = np.log10(np.concatenate([x[np.isfinite(x) & (x > 0)] for x in matrices.values()]))
    limits = (float(np.quantile(logs, 0.02)), float(logs.max()))  # keep ~0 edges from washing out
    fig = plt.figure(figsize=(13, 5.2 * len(models) + 3.4))
    grid = fig.add_gridspec(len(models) + 1, 3, height_ratios=[5.2] * len(models) + [3.0])
    n = int(per_sample.groupby("model").size().max())
    for i, model in enumerate(models):
        title = (
            f"{short_label(model, 40)}: mean |edge score| over {n} sample(s), "
            f"{graph.E:,} edges, L = {graph.num_layers}"
        )
        _edge_heatmap(fig.add_subplot(grid[i, :]), fig, matrices[model], graph, title, limits)
    for j, key in enumerate(("intensity", "info_complexity", "kurtosis")):
        _stat_strip(fig.add_subplot(grid[len(models), j]), per_sample, summary, key, models)
    fig.tight_layout()
    save_figure(fig, path)


def plot_passk(path: Path, passk: pd.DataFrame, models: list[str] | None = None) -> None:
    """pass@k against k (SPEC §7): one panel per domain plus overall, one line per model
    (in the order of ``models``, default: as they appear)."""
    apply_style()
    rows = passk[(passk["subset"] == "all") & passk["level"].isin(["domain", "overall"])]
    panels = [*sorted(rows.loc[rows["level"] == "domain", "domain"].unique()), "overall"]
    models = models or list(dict.fromkeys(rows["model"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.3), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        part = (
            rows[rows["level"] == "overall"]
            if panel == "overall"
            else rows[rows["domain"] == panel]
        )
        for i, model in enumerate(models):
            line = part[part["model"] == model].sort_values("k")
            ax.plot(
                line["k"],
                100 * line["pass_at_k"],
                marker=MARKERS[i % len(MARKERS)],
                markersize=8 - 2 * (i % 3),  # later models drawn smaller: equal curves stay visible
                linestyle=("-", "--", ":")[i % 3],
                color=PALETTE[i % len(PALETTE)],
                label=short_label(model),
            )
        problems = int(part["problems"].max()) if len(part) else 0
        ax.set_title(f"{panel} ({problems} problem{'' if problems == 1 else 's'})")
        ax.set_xscale("log", base=2)
        ks = sorted(part["k"].unique())
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("pass@k (%)")
    axes[0][-1].legend(loc="best", fontsize=8, frameon=False)
    fig.tight_layout()
    save_figure(fig, path)
