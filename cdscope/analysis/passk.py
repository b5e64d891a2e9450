"""Unbiased pass@k and its aggregation over problems, benchmarks and domains (SPEC §7).

For a problem with n samples of which c pass, the unbiased estimator is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1..n} (1 - k / i)

(= 1 when n - c < k). The product form never forms a binomial coefficient, so it is
exact in floating point for any n. ``pass_at_k`` evaluates it for many problems and
many k at once: the factors are laid out on an [problems, max n] grid (factor 1 outside
each problem's range) and multiplied along the row.

Aggregation: a benchmark's pass@k is the mean over its problems; a domain's is the mean
of its benchmarks; overall is the mean of the domains. A "hard" subset (task ids the
user marks) gets the same three levels computed on its problems only.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import pandas as pd

from cdscope.errors import CdscopeError

KEYS = ["model", "benchmark", "domain", "problem_id"]


def check_ks(ks: Sequence[int], n: int) -> list[int]:
    """Sorted distinct k values; refused when one is < 1 or exceeds the samples per problem."""
    if not ks:
        raise CdscopeError("give at least one k for pass@k (e.g. --k 1,5,10)")
    out = sorted({int(k) for k in ks})
    if out[0] < 1:
        raise CdscopeError(f"pass@k needs k >= 1, got k={out[0]}")
    if n < out[-1]:
        raise CdscopeError(
            f"pass@{out[-1]} needs at least {out[-1]} samples per problem but n={n}: "
            f"raise --n to >= {out[-1]} or drop k={out[-1]}"
        )
    return out


def pass_at_k(n: np.ndarray, c: np.ndarray, ks: Sequence[int]) -> np.ndarray:
    """Unbiased pass@k, shape [problems, len(ks)], for per-problem sample counts n, passes c."""
    n = np.asarray(n, dtype=np.int64).reshape(-1)
    c = np.asarray(c, dtype=np.int64).reshape(-1)
    if n.shape != c.shape:
        raise CdscopeError(f"n and c differ in length ({n.size} vs {c.size})")
    if n.size == 0:
        return np.zeros((0, len(ks)))
    if (c < 0).any() or (c > n).any():
        raise CdscopeError("every problem needs 0 <= passes <= samples")
    check_ks(ks, int(n.min()))
    i = np.arange(1, int(n.max()) + 1, dtype=np.float64)  # [I]
    inside = (i[None, :] > (n - c)[:, None]) & (i[None, :] <= n[:, None])  # [P, I]
    out = np.empty((n.size, len(ks)))
    for j, k in enumerate(ks):
        factors = np.where(inside, 1.0 - k / i[None, :], 1.0)
        out[:, j] = 1.0 - np.prod(factors, axis=1)
        out[n - c < k, j] = 1.0
    return out


def problem_counts(samples: pd.DataFrame) -> pd.DataFrame:
    """Per (model, benchmark, domain, problem_id): n samples and c passing."""
    missing = [col for col in [*KEYS, "passed"] if col not in samples.columns]
    if missing:
        raise CdscopeError(f"per-sample frame lacks columns {missing}")
    grouped = samples.groupby(KEYS, sort=True)["passed"]
    return grouped.agg(n="size", c="sum").reset_index()


def _levels(per_problem: pd.DataFrame, ks: list[int], subset: str) -> pd.DataFrame:
    """Benchmark means over problems, domain means over benchmarks, overall over domains."""
    cols = [f"pass@{k}" for k in ks]
    bench = per_problem.groupby(["model", "domain", "benchmark"], sort=True)
    rows = [bench[cols].mean().join(bench.size().rename("problems")).reset_index()]
    rows[0]["level"] = "benchmark"
    domain = rows[0].groupby(["model", "domain"], sort=True)
    rows.append(domain[cols].mean().join(domain["problems"].sum()).reset_index())
    rows[1]["level"], rows[1]["benchmark"] = "domain", ""
    overall = rows[1].groupby("model", sort=True)
    rows.append(overall[cols].mean().join(overall["problems"].sum()).reset_index())
    rows[2]["level"], rows[2]["domain"], rows[2]["benchmark"] = "overall", "", ""
    wide = pd.concat(rows, ignore_index=True)
    wide["subset"] = subset
    long = wide.melt(
        id_vars=["model", "level", "domain", "benchmark", "subset", "problems"],
        value_vars=cols,
        var_name="k",
        value_name="pass_at_k",
    )
    long["k"] = long["k"].str.removeprefix("pass@").astype(int)
    return long


def summarize(
    samples: pd.DataFrame, ks: Sequence[int], hard_ids: Collection[str] | None = None
) -> pd.DataFrame:
    """Long pass@k table from a per-sample frame (columns model, benchmark, domain,
    problem_id, passed). One row per (model, level, domain, benchmark, subset, k) with the
    number of problems behind it; level is benchmark / domain / overall, subset is all or
    hard. Problems with fewer samples than max k are refused (check_ks)."""
    counts = problem_counts(samples)
    if counts.empty:
        raise CdscopeError("no scored samples to compute pass@k from")
    ks = check_ks(ks, int(counts["n"].min()))
    values = pass_at_k(counts["n"].to_numpy(), counts["c"].to_numpy(), ks)
    per_problem = counts.assign(**{f"pass@{k}": values[:, j] for j, k in enumerate(ks)})
    parts = [_levels(per_problem, ks, "all")]
    if hard_ids:
        hard = per_problem[per_problem["problem_id"].isin(set(hard_ids))]
        if not hard.empty:
            parts.append(_levels(hard, ks, "hard"))
    order = {"benchmark": 0, "domain": 1, "overall": 2}
    out = pd.concat(parts, ignore_index=True)
    out = out.sort_values(
        ["subset", "model", "k", "level", "domain", "benchmark"],
        key=lambda col: col.map(order) if col.name == "level" else col,
    )
    return out.reset_index(drop=True)[
        ["model", "subset", "level", "domain", "benchmark", "k", "pass_at_k", "problems"]
    ]
