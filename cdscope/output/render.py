"""Rich tables for the terminal. Percent for humans; Parquet keeps fractions (SPEC §3)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.table import Table
from rich.text import Text

from cdscope.analysis.noise import CLIPPED_MASS_WARN
from cdscope.analysis.spectral import b_shared
from cdscope.messages import VerbatimTable

#: how figures and messages name a measure (figures break the long ones over two lines)
LABELS = {
    "B_shared_C": "B_shared(C)",
    "B_shared_C_unbiased": "B_shared(C)\ncorrected",
    "B_shared_F": "B_shared(F)",
    "R_C": "R(C)",
    "ACG": "ACG",
    "B_dir": "B_dir",
    "B_norm": "B_norm",
}


def measure_name(measure: str) -> str:
    """The one-line name of ``measure`` in messages: ``B_shared_C`` -> ``B_shared(C)``."""
    return LABELS.get(measure, measure).replace("\n", " ")


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def short_model_name(name: str) -> str:
    """Paths shown by their last two components (``runs/cdrft/final`` -> ``cdrft/final``,
    so training runs' ``final`` folders stay apart); hub ids and the embedded name as
    they are."""
    if "/" in name and Path(name).exists():
        return "/".join(Path(name).resolve().parts[-2:])
    return name


def seed_summary_table(frame: pd.DataFrame) -> Table:
    """Per (model, seed): B_shared(C), B_shared(F) in percent and l_m per family."""
    from cdscope.output.frames import control_matrices

    table = VerbatimTable(
        title="Control per seed: B_shared in %, l_m = mean log-likelihood", title_justify="left"
    )
    families = sorted(frame["family"].unique())
    any_dropped = bool(frame["dropped"].any())
    table.add_column("model", no_wrap=True)
    for column in ["seed", "B_shared C", "B_shared F", *[f"l {f}" for f in families]]:
        table.add_column(column, justify="right", no_wrap=True)
    if any_dropped:
        table.add_column("dropped")
    C, F = control_matrices(frame, "C"), control_matrices(frame, "F")  # noqa: N806
    for (model, seed), group in frame.groupby(["model", "seed"], sort=False):
        ell = group.groupby("family")["ell"].first()
        dropped = sorted(group.loc[group["dropped"], "family"].unique())
        kept_c = C.get((model, int(seed)))
        bc = _pct(b_shared(kept_c[1])) if kept_c and len(kept_c[0]) >= 2 else "n/a"
        bf = _pct(b_shared(F[(model, int(seed))][1])) if kept_c and len(kept_c[0]) >= 2 else "n/a"
        cells = [
            short_model_name(str(model)),
            str(seed),
            bc,
            bf,
            *[f"{ell.get(f, float('nan')):.1f}" for f in families],
        ]
        table.add_row(*cells, *([", ".join(dropped) or "-"] if any_dropped else []))
    return table


def measure_label(measure: str, family: object = None, family_b: object = None) -> str:
    """How a tidy table's measure reads for a person: ``B_dir``, ``PR[code]``,
    ``abs_cos[code|logic]`` (``family`` / ``family_b`` None or NaN when absent)."""
    names = [str(f) for f in (family, family_b) if isinstance(f, str)]
    return f"{measure}[{'|'.join(names)}]" if names else measure


def row_label(row: object) -> str:
    """``measure_label`` of a row (a Series or a dict) of an audit table."""
    get = row.get  # type: ignore[attr-defined]
    return measure_label(get("measure"), get("family"), get("family_b"))


def fmt_value(value: float, unit: str = "fraction", signed: bool = False) -> str:
    """A value for a table: a fraction in percent, anything else (PR in gates) as it is."""
    if value != value:  # NaN
        return "n/a"
    scaled = 100 * value if unit == "fraction" else value
    return f"{scaled:+.2f}" if signed else f"{scaled:.2f}"


def negatives(row: object) -> str:
    """'2/3': the paired row's negative Δ_s out of its seeds (counts read back from a
    Parquet file may be floats: shown as integers)."""
    get = row.get  # type: ignore[attr-defined]
    return "/".join(
        str(int(v)) if v == v else "n/a" for v in (float(get("n_negative")), float(get("n")))
    )


def per_seed_table(per_seed: pd.DataFrame, measure: str, title: str) -> Table:
    """One row per model, one column per seed (percent), with the bootstrap spread over
    probe samples under each value when the probe carried per-sample data."""
    spread = "boot_low" in per_seed and per_seed["boot_low"].notna().any()
    table = VerbatimTable(
        title=title,
        title_justify="left",
        caption="[ ]: bootstrap spread over the seed's probe samples (centred on the value); "
        "not a confidence interval: its coverage at a few samples per family is unknown"
        if spread
        else None,
        caption_justify="left",
    )
    seeds = sorted(per_seed["seed"].unique())
    table.add_column("model", no_wrap=True)
    for seed in seeds:
        table.add_column(f"s{seed}", justify="right", no_wrap=True)
    rows = per_seed[per_seed["measure"] == measure]
    unit = str(rows["value_unit"].iloc[0]) if "value_unit" in rows and len(rows) else "fraction"
    nan = float("nan")
    for model in dict.fromkeys(per_seed["model"]):
        part = rows[rows["model"] == model].set_index("seed")
        cells = []
        for s in seeds:
            cell = Text(fmt_value(part["value"].get(s, nan), unit))
            lo, hi = (part[c].get(s, nan) if c in part else nan for c in ("boot_low", "boot_high"))
            if lo == lo and hi == hi:
                cell.append(f"\n[{fmt_value(lo, unit)}, {fmt_value(hi, unit)}]", style="dim")
            cells.append(cell)
        table.add_row(short_model_name(str(model)), *cells)
    return table


def audit_table(summary: pd.DataFrame, paired: pd.DataFrame, title: str) -> Table:
    """Mean ± SE per model and measure, with paired deltas against the reference model."""
    table = VerbatimTable(
        title=title,
        title_justify="left",
        caption=audit_caption(summary, paired),
        caption_justify="left",
    )
    table.add_column("model", no_wrap=True)
    table.add_column("measure", no_wrap=True)
    table.add_column("mean ± SE", justify="right", no_wrap=True)
    if not paired.empty:
        table.add_column("Δ vs ref ± SE", justify="right", no_wrap=True)
        table.add_column("Δ<0", justify="right", no_wrap=True)
        table.add_column("95% t-CI of Δ", justify="right", no_wrap=True)
        table.add_column("SD of Δ", justify="right", no_wrap=True)
        table.add_column("seeds@80% [range]", justify="right", no_wrap=True)
    labels = paired.apply(row_label, axis=1) if not paired.empty else None
    for _, row in summary.iterrows():
        label, unit = row_label(row), row.get("value_unit", "fraction")
        cells = [
            short_model_name(str(row["model"])),
            label,
            f"{fmt_value(row['mean'], unit)} ± {fmt_value(row['se'], unit)}",
        ]
        if not paired.empty:
            match = paired[(paired["model"] == row["model"]) & (labels == label)]
            if match.empty:
                cells += [
                    "ref" if row["model"] == paired["reference"].iloc[0] else "-",
                    "",
                    "",
                    "",
                    "",
                ]
            else:
                d = match.iloc[0]
                cells += [
                    f"{fmt_value(d['mean'], unit, True)} ± {fmt_value(d['se'], unit)}",
                    negatives(d),
                    f"[{fmt_value(d['ci_low'], unit, True)}, {fmt_value(d['ci_high'], unit, True)}]",
                    fmt_value(d.get("sd", float("nan")), unit),
                    seeds_cell(d),
                ]
        table.add_row(*cells)
    return table


def _seeds(value: float) -> str:
    """A seeds-needed count: n/a (NaN), > 100000 (inf) or an integer."""
    if value != value:
        return "n/a"
    return "> 100000" if value == float("inf") else f"{int(value)}"


def seeds_cell(row: object) -> str:
    """'17 [7, 579]': seeds needed for the target Δ and its range from the SD's chi-square
    interval (a file written before the range: the count alone)."""
    get = row.get  # type: ignore[attr-defined]
    count = _seeds(float(get("seeds_needed", float("nan"))))
    low, high = (float(get(c, float("nan"))) for c in ("seeds_needed_low", "seeds_needed_high"))
    return count if low != low else f"{count} [{_seeds(low)}, {_seeds(high)}]"


#: what every audit table says about the noise-corrected measures it may show
NOT_COMPARABLE = (
    "*_unbiased: noise-corrected estimator of another quantity than the plain measure "
    "(the expected rows' Gram): never compare it with the plain value or with published "
    "plain values; gram_negative_mass: share of its eigenvalue mass clipped "
    f"(> {100 * CLIPPED_MASS_WARN:g}%: unreliable)"
)


def audit_caption(summary: pd.DataFrame, paired: pd.DataFrame) -> str:
    """The audit table's caption: units, what the seeds column detects, and the
    noise-corrected measures' warning when they are shown."""
    parts = ["fractions shown in %; Δ in percentage points; PR in gates"]
    if not paired.empty and "detect" in paired and paired["detect"].notna().any():
        target = 100 * float(paired["detect"].dropna().iloc[0])
        parts.append(
            f"seeds@80%: seeds a paired t-test (α 0.05) needs to detect the target "
            f"Δ = {target:g} points (--detect; not the observed Δ), [range] from the SD's "
            "95% chi-square interval"
        )
    if summary["measure"].astype(str).str.endswith("_unbiased").any():
        parts.append(NOT_COMPARABLE)
    return "; ".join(parts)


def _captioned(title: str, caption: str, columns: tuple[str, ...]) -> Table:
    """A table with a caption whose first column (the model) is left-aligned."""
    table = VerbatimTable(
        title=title, title_justify="left", caption=caption, caption_justify="left"
    )
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    return table


def convergence_table(convergence: pd.DataFrame) -> Table:
    """Per model: does the leading eigenvector of the Gram stay put across seeds?"""
    table = _captioned(
        "direction check: leading eigenvector of G per seed vs the seeds' mean",
        "angles in degrees (family space; gate space for the right singular vector); "
        "DK: Davis-Kahan bound 2||Ĝ_s - Ḡ|| / gap; gap: (λ1 - λ2) / tr in %",
        ("model", "seeds", "angle mean/max", "DK bound mean", "gate angle mean", "gap mean"),
    )
    for model, g in convergence.groupby("model", sort=False):
        table.add_row(
            short_model_name(str(model)),
            str(len(g)),
            f"{g['angle_deg'].mean():.1f} / {g['angle_deg'].max():.1f}",
            f"{g['dk_bound_deg'].mean():.1f}",
            f"{g['gate_angle_deg'].mean():.1f}",
            f"{100 * g['eigengap'].mean():.1f}",
        )
    return table


def nsweep_table(summary: pd.DataFrame) -> Table:
    """nsweep: per model and n, plain and corrected B_shared(C) mean ± SE (percent)."""
    table = _captioned(
        "cdscope nsweep: B_shared(C) against n, mean ± SE over seeds",
        "corrected: unbiased (U-statistic) Gram, needs n >= 2, an estimator of another "
        "quantity: not comparable with plain (nor with published plain values); clipped: "
        f"negative eigenvalue mass of that Gram (> {100 * CLIPPED_MASS_WARN:g}%: corrected "
        "unreliable)",
        ("model", "n", "seeds", "plain (%)", "corrected (%)", "clipped (%)"),
    )
    cells = summary.set_index(["model", "n", "measure"])
    for model, n in summary[["model", "n"]].drop_duplicates().itertuples(index=False):

        def cell(measure: str, model=model, n=n) -> str:  # noqa: ANN001
            key = (model, n, measure)
            if key not in cells.index:
                return "n/a"
            row = cells.loc[key]
            return f"{fmt_value(row['mean'])} ± {fmt_value(row['se'])}"

        table.add_row(
            short_model_name(str(model)),
            str(n),
            str(int(cells.loc[(model, n, "B_shared_C"), "n_seeds"])),
            cell("B_shared_C"),
            cell("B_shared_C_unbiased"),
            cell("gram_negative_mass"),
        )
    return table


def random_ref_table(stats: dict) -> Table:
    table = VerbatimTable(
        title=f"Random reference B_shared (%): M = {stats['M']}, K = {stats['K']}, "
        f"T = {stats['trials']:,}, seed {stats['seed']}",
        title_justify="left",
    )
    for column in ("1/M", "mean", "std", "p95", "p99"):
        table.add_column(column, justify="right")
    cells = [
        _pct(1 / stats["M"]),
        _pct(stats["mean"]),
        _pct(stats["std"]),
        _pct(stats["p95"]),
        _pct(stats["p99"]),
    ]
    if stats.get("value") is not None:
        table.add_column("value", justify="right")
        table.add_column("percentile", justify="right")
        cells += [_pct(stats["value"]), f"{stats['percentile']:.1f}"]
    table.add_row(*cells)
    return table


def gradcheck_table(frame: pd.DataFrame) -> Table:
    """Per (estimator, eps): cosine and relative error vs exact, per seed and worst case."""
    seeds = sorted(frame["seed"].unique())
    caption = "* = default estimator; time = median seconds per gradient"
    if "routing_decisions" in frame and frame["routing_decisions"].notna().any():
        held = frame[["routing_decisions", "routing_switched", "routing_unheld"]].sum()
        caption += (
            f"; MoE: the perturbed forwards held each token's nominal experts, "
            f"{int(held['routing_switched'])} of {int(held['routing_decisions'])} decisions "
            f"would have switched ({int(held['routing_unheld'])} not held)"
        )
    table = VerbatimTable(
        title="Regulariser gradient vs exact (cosine | relative L2 error)",
        title_justify="left",
        caption=caption,
        caption_justify="left",
    )
    table.add_column("estimator", no_wrap=True)
    table.add_column("eps", justify="right")
    for seed in seeds:
        table.add_column(f"seed {seed}", justify="right", no_wrap=True)
    table.add_column("min cos", justify="right")
    table.add_column("time", justify="right")
    for (estimator, eps), group in frame.groupby(["estimator", "eps"], sort=False):
        by_seed = group.set_index("seed")
        star = "*" if bool(group["is_default"].any()) else ""
        cells = [
            f"{by_seed.loc[s, 'cosine']:.6f} | {by_seed.loc[s, 'rel_error']:.1e}"
            if s in by_seed.index
            else "-"
            for s in seeds
        ]
        table.add_row(
            f"{estimator}{star}",
            f"{eps:g}",
            *cells,
            f"{group['cosine'].min():.6f}",
            f"{group['seconds'].median():.1f}",
        )
    exact = frame.groupby("seed")["exact_seconds"].first().median()
    table.add_row("exact", "-", *["1 | 0" for _ in seeds], "1", f"{exact:.1f}")
    return table


def _g(value: float, signed: bool = False) -> str:
    """Significant digits for statistics of any scale (edge scores are often ~1e-3)."""
    if value != value:  # NaN
        return "n/a"
    return f"{value:+.4g}" if signed else f"{value:.4g}"


def eap_summary_table(summary: pd.DataFrame, paired: pd.DataFrame, counts: dict) -> Table:
    """Per model and statistic: mean over samples with its bootstrap interval; paired Δ."""
    caption = "; ".join(
        f"{short_model_name(str(m))}: {c.get('correct', 0)}/{c.get('drawn', 0)} correct"
        f" ({c.get('incorrect', 0)} wrong, {c.get('unsupported', 0)} unsupported,"
        f" {c.get('too_long', 0)} too long)"
        for m, c in counts.items()
    )
    table = VerbatimTable(
        title="Edge attribution per sample: mean [95% bootstrap interval, not a CI]",
        title_justify="left",
        caption=caption + ("; Δ = model - baseline on the same samples" if len(paired) else ""),
        caption_justify="left",
    )
    for column in ("model", "statistic"):
        table.add_column(column, no_wrap=True)
    for column in ("n", "mean", "bootstrap 95%"):
        table.add_column(column, justify="right", no_wrap=True)
    if len(paired):
        table.add_column("Δ", justify="right", no_wrap=True)
        table.add_column("bootstrap 95% of Δ", justify="right", no_wrap=True)
    for row in summary.itertuples():
        cells = [
            short_model_name(str(row.model)),
            str(row.statistic),
            str(row.n),
            _g(row.mean),
            f"[{_g(row.boot_low)}, {_g(row.boot_high)}]",
        ]
        if len(paired):
            d = paired[(paired["model"] == row.model) & (paired["statistic"] == row.statistic)]
            cells += (
                ["", ""]
                if d.empty
                else [
                    _g(d["mean_diff"].iloc[0], True),
                    f"[{_g(d['boot_low'].iloc[0], True)}, {_g(d['boot_high'].iloc[0], True)}]",
                ]
            )
        table.add_row(*cells)
    return table


def _short_pair(pair: str, benchmark: str) -> str:
    """'math/gcd/eval/0 ~ math/gcd/train/3' -> 'eval/0 ~ train/3' (benchmark prefix dropped)."""
    return " ~ ".join(p.removeprefix(benchmark + "/") for p in pair.split(" ~ "))


def contamination_table(frame: pd.DataFrame) -> Table:
    """``eval --audit``: per benchmark and reference set, the eval items flagged."""
    table = VerbatimTable(title="contamination audit: eval items flagged", title_justify="left")
    heads = ["benchmark", "vs", "items", "exact", "normalised", "J>=0.5", "J>=0.8"]
    heads += ["code items", "same asserts", "max J", "max J pair"]
    for name in heads:
        left = name in ("benchmark", "vs", "max J pair")
        table.add_column(name, justify="left" if left else "right", no_wrap=name != "max J pair")
    thresholds = [c for c in frame.columns if c.startswith("jaccard>=")]
    for row in frame.to_dict("records"):
        cells = [row["benchmark"], row["against"], row["items"], row["exact"], row["normalised"]]
        cells += [row[c] for c in thresholds] + [row["code_items"], row["same_asserts"]]
        cells += [f"{row['max_jaccard']:.3f}", _short_pair(row["max_pair"], row["benchmark"])]
        table.add_row(*(str(c) for c in cells))
    return table
