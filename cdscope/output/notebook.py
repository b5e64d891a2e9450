"""Short views of results for a notebook or a REPL: ``__repr__`` and ``_repr_html_``.

``print(result)`` shows what a person looks at first (the headline measure per model,
mean ± SE over seeds, the paired Δ against the reference) and names the tables that hold
the rest; the full tables stay one attribute away (``result.summary``, ...). Values are
shown as the CLI's tables show them (fractions in percent, PR in gates, SPEC §3).
"""

from __future__ import annotations

import pandas as pd

from cdscope.output import html
from cdscope.output.render import NOT_COMPARABLE, fmt_value, negatives, short_model_name

HEADLINE_HEADERS = ("model", "measure", "seeds", "mean ± SE", "Δ vs reference ± SE", "Δ < 0")


def headline_measures(summary: pd.DataFrame, headline: str) -> list[str]:
    """The headline measure and, where the probe allowed it, its noise-corrected twin."""
    twin = f"{headline}_unbiased"
    return [headline, *([twin] if (summary["measure"] == twin).any() else [])]


def headline_note(measures: list[str]) -> str | None:
    """What the headline says when it shows a noise-corrected twin (render.NOT_COMPARABLE)."""
    return NOT_COMPARABLE if any(m.endswith("_unbiased") for m in measures) else None


def headline_rows(
    summary: pd.DataFrame, paired: pd.DataFrame, measures: list[str]
) -> list[list[str]]:
    """Per measure and model: seeds, mean ± SE and, for later models, the same-seed
    paired Δ against the first model ('ref' on the reference's row)."""
    rows = []
    for measure in measures:
        rows += _rows(summary, paired, measure)
    return rows


def _rows(summary: pd.DataFrame, paired: pd.DataFrame, measure: str) -> list[list[str]]:
    rows = []
    mine = summary[summary["measure"] == measure]
    deltas = paired[paired["measure"] == measure] if len(paired) else paired
    clipped = summary[summary["measure"] == "gram_negative_mass"].set_index("model")["mean"]
    for row in mine.itertuples(index=False):
        unit = getattr(row, "value_unit", "fraction")
        # a corrected measure carries the eigenvalue mass clipped to read it
        label = measure
        if measure.endswith("_unbiased") and row.model in clipped.index:
            label += f" (clipped {fmt_value(float(clipped[row.model]))}%)"
        cells = [
            short_model_name(str(row.model)),
            label,
            str(int(row.n_seeds)),
            f"{fmt_value(row.mean, unit)} ± {fmt_value(row.se, unit)}",
        ]
        match = deltas[deltas["model"] == row.model] if len(deltas) else deltas
        if len(match):
            d = match.iloc[0]
            cells += [
                f"{fmt_value(d['mean'], unit, True)} ± {fmt_value(d['se'], unit)}",
                negatives(d),
            ]
        else:
            cells += ["ref" if len(paired) else "", ""]
        rows.append(cells)
    return rows


def _title(command: str, summary: pd.DataFrame) -> str:
    models, seeds = summary["model"].nunique(), int(summary["n_seeds"].max())
    return f"cdscope {command}: {models} model(s) x {seeds} seed(s); values in %"


def _sizes(tables: dict[str, pd.DataFrame]) -> str:
    return ", ".join(f".{name} ({len(frame):,} rows)" for name, frame in tables.items())


def audit_repr(command: str, headline: str, tables: dict[str, pd.DataFrame]) -> str:
    """A few lines: the audit, its models and seeds, the headline per model, the tables."""
    summary, paired = tables["summary"], tables["paired"]
    measures = headline_measures(summary, headline)
    rows = headline_rows(summary, paired, measures)
    headers = list(HEADLINE_HEADERS) if len(paired) else list(HEADLINE_HEADERS[:4])
    rows = [r[: len(headers)] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [
        f"<{_title(command, summary)}>",
        "  " + "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
    ]
    lines += [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    ]
    note = headline_note(measures)
    lines += [f"  note: {note}"] if note else []
    lines.append(f"  tables: {_sizes(tables)}")
    return "\n".join(lines)


def audit_html(command: str, headline: str, tables: dict[str, pd.DataFrame]) -> str:
    """The same as ``audit_repr`` as an HTML table (a notebook's rich display)."""
    summary, paired = tables["summary"], tables["paired"]
    measures = headline_measures(summary, headline)
    rows = headline_rows(summary, paired, measures)
    headers = list(HEADLINE_HEADERS) if len(paired) else list(HEADLINE_HEADERS[:4])
    title = html.element("strong", html.text(_title(command, summary)))
    caption = "; ".join(filter(None, [headline_note(measures), _sizes(tables)]))
    body = html.table(headers, [r[: len(headers)] for r in rows], caption=caption)
    return f"<div>{title}{body}</div>"


def _reference_cells(stats: dict) -> tuple[list[str], list[str]]:
    headers = ["M", "K", "trials", "1/M", "mean", "std", "p95", "p99"]
    cells = [str(stats["M"]), str(stats["K"]), f"{stats['trials']:,}"]
    cells += [fmt_value(v) for v in (1 / stats["M"], stats["mean"], stats["std"])]
    cells += [fmt_value(stats["p95"]), fmt_value(stats["p99"])]
    if stats.get("value") is not None:
        headers += ["value", "percentile"]
        cells += [fmt_value(stats["value"]), f"{stats['percentile']:.1f}"]
    return headers, cells


def reference_repr(stats: dict) -> str:
    """One line: the random reference's size and statistics (percent)."""
    headers, cells = _reference_cells(stats)
    pairs = ", ".join(f"{h} {c}" for h, c in zip(headers, cells, strict=True))
    return f"<cdscope random_reference (B_shared in %): {pairs}; tables: .frame, .stats>"


def reference_html(stats: dict) -> str:
    headers, cells = _reference_cells(stats)
    title = html.element("strong", html.text("cdscope random reference: B_shared in %"))
    return f"<div>{title}{html.table(headers, [cells])}</div>"
