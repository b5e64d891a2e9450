"""Seed-level statistics of the estimation protocol (SPEC §4) and bootstrap intervals (§6).

A measurement is repeated over probe seeds s = 0..S-1 and summarised as

    mean = (1/S) sum_s v_s,        SE = std(v, ddof=1) / sqrt(S).

Two models A and B evaluated on the same seeds are compared through the paired
differences Delta_s = v_A(s) - v_B(s): mean +/- SE of Delta, the number of negative
Delta_s, and the Student-t interval

    mean(Delta) +/- t_{(1+level)/2, S-1} * SE(Delta)       (level = 0.95 by default).

With S = 1 there is no spread estimate: SE and the interval are NaN.

The percentile bootstrap (used for the edge-attribution statistics, SPEC §6) resamples
the n observations with replacement B times (all B resamples drawn at once from
``np.random.default_rng(seed)``), evaluates the statistic on each, and reports the
(1-level)/2 and (1+level)/2 quantiles of those B values. The paired version resamples
pairs jointly, which is the same as bootstrapping the per-pair differences.

Power of the paired comparison: with per-seed differences of standard deviation sd, a
two-sided paired t-test at level alpha over S seeds rejects "mean Delta = 0" with
probability

    power(S) = P(|T| > t_{1-alpha/2, S-1}),   T ~ noncentral t(df = S-1, nc = Delta sqrt(S) / sd),

and ``seeds_needed`` is the smallest S >= 2 with power(S) >= the target (0.8 by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import nctdtr, stdtrit  # t quantile, noncentral t CDF; lighter than scipy.stats

__all__ = [
    "BootstrapCI",
    "PairedDiff",
    "bootstrap_ci",
    "mean_se",
    "paired_bootstrap_ci",
    "paired_difference",
    "paired_t_power",
    "seeds_needed",
]


def _as_sample(values: ArrayLike, name: str = "values") -> np.ndarray:
    """A non-empty 1-D float64 array."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per seed/sample); got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    return arr


def _as_pair(a: ArrayLike, b: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    x, y = _as_sample(a, "a"), _as_sample(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"paired samples need equal lengths; got {x.size} and {y.size}")
    return x, y


def _check_level(level: float) -> float:
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1; got {level}")
    return float(level)


def mean_se(values: ArrayLike) -> tuple[float, float]:
    """``(mean, SE)`` with SE = std(values, ddof=1) / sqrt(S) (SPEC §4); SE is NaN if S = 1."""
    v = _as_sample(values)
    S = v.size
    se = float(v.std(ddof=1) / np.sqrt(S)) if S > 1 else float("nan")
    return float(v.mean()), se


@dataclass(frozen=True, eq=False)
class PairedDiff:
    """Summary of per-seed differences Delta_s = value_A(s) - value_B(s) (SPEC §4)."""

    n: int
    mean: float
    se: float
    n_negative: int
    ci_low: float
    ci_high: float
    deltas: np.ndarray


def paired_difference(a: ArrayLike, b: ArrayLike, level: float = 0.95) -> PairedDiff:
    """Paired comparison of per-seed values ``a`` (model A) and ``b`` (model B) (SPEC §4).

    Delta_s = a_s - b_s; reports mean(Delta), SE = std(Delta, ddof=1)/sqrt(S), the count
    of Delta_s < 0, and the Student-t interval mean +/- t.ppf((1+level)/2, S-1) * SE.
    With S = 1, SE and the interval are NaN. Unequal lengths raise ValueError.
    """
    level = _check_level(level)
    x, y = _as_pair(a, b)
    deltas = x - y
    deltas.flags.writeable = False
    mean, se = mean_se(deltas)
    S = deltas.size
    if S > 1:
        half = float(stdtrit(S - 1, 0.5 + level / 2.0)) * se
        lo, hi = mean - half, mean + half
    else:
        lo = hi = float("nan")
    return PairedDiff(
        n=S,
        mean=mean,
        se=se,
        n_negative=int(np.count_nonzero(deltas < 0.0)),
        ci_low=lo,
        ci_high=hi,
        deltas=deltas,
    )


@dataclass(frozen=True)
class BootstrapCI:
    """Point estimate ``stat(values)`` and its percentile-bootstrap interval."""

    estimate: float
    ci_low: float
    ci_high: float
    B: int
    level: float


def bootstrap_ci(
    values: ArrayLike,
    stat: Callable[..., np.ndarray] = np.mean,
    B: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> BootstrapCI:
    """Percentile bootstrap interval for ``stat(values)`` (SPEC §6: B = 2000 resamples).

    Draws a [B, n] matrix of indices uniformly with replacement from
    ``np.random.default_rng(seed)``, evaluates ``stat(resamples, axis=-1)`` once on the
    stacked resamples (``stat`` must reduce along an ``axis`` keyword, as numpy
    reductions do), and returns the (1-level)/2 and (1+level)/2 quantiles of the B
    bootstrap values. Deterministic given ``seed``.
    """
    level = _check_level(level)
    if int(B) < 1:
        raise ValueError(f"B must be >= 1; got {B}")
    v = _as_sample(values)
    idx = np.random.default_rng(seed).integers(0, v.size, size=(int(B), v.size))
    boot = np.asarray(stat(v[idx], axis=-1), dtype=np.float64)
    if boot.shape != (int(B),):
        raise ValueError(f"stat must reduce each resample to a scalar; got shape {boot.shape}")
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
    return BootstrapCI(
        estimate=float(stat(v)), ci_low=float(lo), ci_high=float(hi), B=int(B), level=level
    )


def paired_bootstrap_ci(
    a: ArrayLike,
    b: ArrayLike,
    stat: Callable[..., np.ndarray] = np.mean,
    B: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> BootstrapCI:
    """Percentile bootstrap interval for ``stat(a - b)`` on paired samples.

    Pairs (a_i, b_i) are resampled jointly, which is exactly bootstrapping the
    differences d_i = a_i - b_i; with the default ``stat = np.mean`` this is the interval
    for the mean difference. Unequal lengths raise ValueError.
    """
    x, y = _as_pair(a, b)
    return bootstrap_ci(x - y, stat=stat, B=B, seed=seed, level=level)


def paired_t_power(delta: float, sd: float, seeds: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test at level ``alpha`` over ``seeds`` pairs (module doc).

    ``delta`` is the true mean difference, ``sd`` the standard deviation of the per-seed
    differences. Needs seeds >= 2; sd = 0 with delta != 0 gives power 1.
    """
    if seeds < 2:
        raise ValueError(f"a paired t-test needs at least 2 seeds; got {seeds}")
    _check_level(1.0 - alpha)
    if not sd > 0.0:
        return 1.0 if delta != 0.0 else alpha
    df = seeds - 1
    nc = abs(delta) * np.sqrt(seeds) / sd
    crit = float(stdtrit(df, 1.0 - alpha / 2.0))
    return float(1.0 - nctdtr(df, nc, crit) + nctdtr(df, nc, -crit))


def seeds_needed(
    delta: float, sd: float, power: float = 0.8, alpha: float = 0.05, max_seeds: int = 100_000
) -> float:
    """Smallest number of seeds S >= 2 whose paired t-test detects ``delta`` with ``power``.

    Power grows with S, so a doubling search brackets S and a bisection finds it. Returns
    NaN when sd is NaN or delta is 0, and inf when even ``max_seeds`` seeds are not enough.
    """
    if not np.isfinite(sd) or not np.isfinite(delta) or delta == 0.0:
        return float("nan")
    _check_level(power)
    if paired_t_power(delta, sd, 2, alpha) >= power:
        return 2.0
    lo, hi = 2, 4
    while paired_t_power(delta, sd, hi, alpha) < power:
        if hi >= max_seeds:
            return float("inf")
        lo, hi = hi, min(2 * hi, max_seeds)
    while hi - lo > 1:  # invariant: power(lo) < target <= power(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if paired_t_power(delta, sd, mid, alpha) >= power else (mid, hi)
    return float(hi)
