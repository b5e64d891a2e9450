"""Text helpers of the replication report (replication_report.py): numbers as the report
prints them, markdown tables, and an interval read as words."""

from __future__ import annotations

import math

import pandas as pd


def fmt(x: float, digits: int = 2, sign: bool = True) -> str:
    """x with ``digits`` decimals (signed unless ``sign`` is False); n/a when not finite."""
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"


def pm(mean: float, se: float, sign: bool = True) -> str:
    """'mean ± SE' in the given unit; the SE is n/a from one value."""
    return f"{fmt(mean, 2, sign)} ± {fmt(se, 2, False)}"


def table(header: list[str], rows: list[list[str]], right: int = 1) -> list[str]:
    """A markdown table; columns from ``right`` on are right-aligned."""
    align = ["---"] * right + ["---:"] * (len(header) - right)
    body = ["| " + " | ".join(map(str, r)) + " |" for r in rows]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|", *body, ""]


def change_words(row: pd.Series) -> str:
    """One problem_changes row as words read off its interval: rose / fell when the
    interval excludes 0, no detectable change when it holds 0 (pp)."""
    if row["n"] == 0:
        return "cannot be compared (no problem is held at both states)"
    mean, lo, hi = 100 * row["mean"], 100 * row["lo"], 100 * row["hi"]
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"changed by {fmt(mean, 1)} pp on {row['n']} problem (no interval)"
    span = f"95 % t-interval [{fmt(lo, 1)}, {fmt(hi, 1)}] pp over {row['n']} problems"
    if lo > 0:
        return f"rose by {fmt(mean, 1)} pp ({span})"
    if hi < 0:
        return f"fell by {fmt(mean, 1)} pp ({span})"
    return f"showed no detectable change ({fmt(mean, 1)} pp; the {span} holds 0)"
