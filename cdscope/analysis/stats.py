"""Seed-level statistics of the estimation protocol (SPEC §4) and bootstrap intervals (§6).

A measurement is repeated over probe seeds s = 0..S-1 and summarised as

    mean = (1/S) sum_s v_s,        SE = std(v, ddof=1) / sqrt(S).

Two models A and B evaluated on the same seeds are compared through the paired
differences Delta_s = v_A(s) - v_B(s): mean +/- SE of Delta, the number of negative
Delta_s, and the Student-t interval

    mean(Delta) +/- t_{(1+level)/2, S-1} * SE(Delta)       (level = 0.95 by default).

With S = 1 there is no spread estimate: SE and the interval are NaN.

The bootstrap (used for the edge-attribution statistics, SPEC §6) resamples the n
observations with replacement B times (all B resamples drawn at once from
``np.random.default_rng(seed)``) and evaluates the statistic on each; Q_p denotes the
p-quantile of those B values and theta_hat the statistic on the full sample. Two
intervals (``bootstrap_interval``):

    percentile:  [Q_{(1-level)/2},                    Q_{(1+level)/2}]
    centred:     [theta_hat + Q_{(1-level)/2} - Q_{1/2}, theta_hat + Q_{(1+level)/2} - Q_{1/2}]

The centred interval (the default) is the percentile interval moved so that the
bootstrap median sits on theta_hat: it keeps the bootstrap's spread and always
contains theta_hat, because Q_{(1-level)/2} <= Q_{1/2} <= Q_{(1+level)/2}. The plain
percentile interval can miss theta_hat entirely when the statistic is biased under
resampling, which small n makes common: a resample of n = 3 observations repeats one
of them with probability 7/9, and a statistic that reacts to repeats (B_shared of three
resampled probe samples per family, for one) then has most of its bootstrap values on
one side of theta_hat. For a bootstrap distribution whose median is theta_hat the two
intervals are equal. Bias-correcting variants (basic, BC, BCa, bootstrap-t) do not
help here: each excludes theta_hat exactly when the bootstrap median lies far from it.
The centred interval does not correct bias either; it states the spread around the
estimate. The paired version resamples pairs jointly, which is the same as
bootstrapping the per-pair differences.

Power of the paired comparison: with per-seed differences of standard deviation sd, a
two-sided paired t-test at level alpha over S seeds rejects "mean Delta = 0" with
probability

    power(S) = P(|T| > t_{1-alpha/2, S-1}),   T ~ noncentral t(df = S-1, nc = Delta sqrt(S) / sd),

and ``seeds_needed`` is the smallest S >= 2 with power(S) >= the target (0.8 by default).
Delta is a *stated* target effect (the audits' ``--detect``, the replication's
pre-registered effect), never the observed mean difference: power computed at the
observed effect is a function of the p-value and says nothing the test did not.

The SD it is computed from is itself an estimate from S_0 values. For normal data,
(S_0 - 1) s^2 / sigma^2 ~ chi^2_{S_0 - 1}, so

    sigma in [ s sqrt((S_0-1) / chi^2_{(1+level)/2, S_0-1}),  s sqrt((S_0-1) / chi^2_{(1-level)/2, S_0-1}) ]

with probability ``level`` (``sd_interval``), and since seeds_needed grows with sd, the
seeds needed at the two ends bound it with the same probability
(``seeds_needed_interval``). At S_0 = 3 the range is wide: sd = 7.5 points and Delta = 5.5
give 17 seeds, within [7, 579].
scipy's noncentral t CDF (``nctdtr``) returns NaN where a tail underflows (measured at
x = +-t_crit for alpha 0.01..0.1, df 1..50, nc 0.01..1e4: 14,402 NaNs, all at x < nc,
with finite values within +-10 % of nc below 4e-14; e.g. df = 1, nc = 8.9 at -t_crit),
so a NaN tail probability at a point below the noncentrality is read as 0; elsewhere it
stays NaN. Without that, power(2) was NaN and ``seeds_needed`` answered 3 where 2 suffice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import (  # lighter than scipy.stats
    chdtri,  # chi-square quantile by upper tail
    nctdtr,  # noncentral t CDF
    stdtrit,  # t quantile
)

__all__ = [
    "BOOTSTRAP_METHODS",
    "BootstrapCI",
    "PairedDiff",
    "bootstrap_ci",
    "bootstrap_interval",
    "mean_se",
    "paired_bootstrap_ci",
    "paired_difference",
    "paired_t_power",
    "sd_interval",
    "seeds_needed",
    "seeds_needed_interval",
    "t_interval",
]

#: interval methods of ``bootstrap_interval`` (module doc); the first is the default
BOOTSTRAP_METHODS = ("centred", "percentile")


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


def t_interval(values: ArrayLike, level: float = 0.95) -> tuple[float, float, float, float]:
    """``(mean, SE, low, high)``: the Student-t interval mean +/- t_{(1+level)/2, S-1} * SE
    over S values (SPEC §4); SE and the interval are NaN when S = 1."""
    level = _check_level(level)
    mean, se = mean_se(values)
    S = np.asarray(values).size
    if S < 2:
        return mean, se, float("nan"), float("nan")
    half = float(stdtrit(S - 1, 0.5 + level / 2.0)) * se
    return mean, se, mean - half, mean + half


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
    x, y = _as_pair(a, b)
    deltas = x - y
    deltas.flags.writeable = False
    mean, se, lo, hi = t_interval(deltas, level)
    return PairedDiff(
        n=deltas.size,
        mean=mean,
        se=se,
        n_negative=int(np.count_nonzero(deltas < 0.0)),
        ci_low=lo,
        ci_high=hi,
        deltas=deltas,
    )


@dataclass(frozen=True)
class BootstrapCI:
    """Point estimate ``stat(values)`` and its bootstrap interval (``method``, module doc)."""

    estimate: float
    ci_low: float
    ci_high: float
    B: int
    level: float
    method: str = BOOTSTRAP_METHODS[0]


def bootstrap_interval(
    draws: ArrayLike, estimate: float, level: float = 0.95, method: str = BOOTSTRAP_METHODS[0]
) -> tuple[float, float]:
    """``(low, high)`` from bootstrap values ``draws`` of a statistic whose full-sample
    value is ``estimate`` (module doc): ``centred`` (contains ``estimate`` whenever it is
    finite) or ``percentile``. Non-finite draws (a resample on which the statistic is
    undefined) are left out; with none left, or a non-finite centred estimate, NaN."""
    level = _check_level(level)
    if method not in BOOTSTRAP_METHODS:
        raise ValueError(f"method must be one of {', '.join(BOOTSTRAP_METHODS)}; got {method!r}")
    v = np.asarray(draws, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    alpha = (1.0 - level) / 2.0
    lo, mid, hi = np.quantile(v, [alpha, 0.5, 1.0 - alpha])
    if method == "percentile":
        return float(lo), float(hi)
    # estimate - (Q_1/2 - Q_lo) <= estimate <= estimate + (Q_hi - Q_1/2) holds in floating
    # point too (subtracting / adding a non-negative number rounds monotonically)
    est = float(estimate)  # non-finite: a NaN interval
    return est - float(mid - lo), est + float(hi - mid)


def bootstrap_ci(
    values: ArrayLike,
    stat: Callable[..., np.ndarray] = np.mean,
    B: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    method: str = BOOTSTRAP_METHODS[0],
) -> BootstrapCI:
    """Bootstrap interval for ``stat(values)`` (SPEC §6: B = 2000 resamples; module doc).

    Draws a [B, n] matrix of indices uniformly with replacement from
    ``np.random.default_rng(seed)``, evaluates ``stat(resamples, axis=-1)`` once on the
    stacked resamples (``stat`` must reduce along an ``axis`` keyword, as numpy
    reductions do), and turns the B bootstrap values into an interval with
    ``bootstrap_interval`` (``centred`` by default: it always contains the estimate).
    Deterministic given ``seed``.
    """
    level = _check_level(level)
    if int(B) < 1:
        raise ValueError(f"B must be >= 1; got {B}")
    v = _as_sample(values)
    idx = np.random.default_rng(seed).integers(0, v.size, size=(int(B), v.size))
    boot = np.asarray(stat(v[idx], axis=-1), dtype=np.float64)
    if boot.shape != (int(B),):
        raise ValueError(f"stat must reduce each resample to a scalar; got shape {boot.shape}")
    estimate = float(stat(v))
    lo, hi = bootstrap_interval(boot, estimate, level, method)
    return BootstrapCI(
        estimate=estimate, ci_low=lo, ci_high=hi, B=int(B), level=level, method=method
    )


def paired_bootstrap_ci(
    a: ArrayLike,
    b: ArrayLike,
    stat: Callable[..., np.ndarray] = np.mean,
    B: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    method: str = BOOTSTRAP_METHODS[0],
) -> BootstrapCI:
    """Bootstrap interval for ``stat(a - b)`` on paired samples (``method`` as ``bootstrap_ci``).

    Pairs (a_i, b_i) are resampled jointly, which is exactly bootstrapping the
    differences d_i = a_i - b_i; with the default ``stat = np.mean`` this is the interval
    for the mean difference. Unequal lengths raise ValueError.
    """
    x, y = _as_pair(a, b)
    return bootstrap_ci(x - y, stat=stat, B=B, seed=seed, level=level, method=method)


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
    return float(1.0 - _nct_cdf(df, nc, crit) + _nct_cdf(df, nc, -crit))


def _nct_cdf(df: int, nc: float, x: float) -> float:
    """P(T <= x) for T ~ noncentral t(df, nc); scipy's NaN at an underflowing tail below
    the noncentrality (x < nc) is read as 0 (module doc), any other NaN stays NaN."""
    value = float(nctdtr(df, nc, x))
    return 0.0 if np.isnan(value) and x < nc else value


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


def sd_interval(sd: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """Chi-square interval of a normal population's SD from a sample SD ``sd`` of ``n``
    values (module doc); NaN for n < 2 or a non-finite ``sd``."""
    level = _check_level(level)
    if n < 2 or not np.isfinite(sd):
        return float("nan"), float("nan")
    df = n - 1
    # chdtri(df, p) is the chi-square value with upper tail p
    low = sd * np.sqrt(df / chdtri(df, (1.0 - level) / 2.0))
    high = sd * np.sqrt(df / chdtri(df, (1.0 + level) / 2.0))
    return float(low), float(high)


def seeds_needed_interval(
    delta: float, sd: float, n: int, power: float = 0.8, alpha: float = 0.05, level: float = 0.95
) -> tuple[float, float]:
    """``seeds_needed`` at both ends of ``sd_interval(sd, n, level)``: the range of seeds a
    paired t-test needs to detect the target ``delta`` that the SD's own uncertainty
    allows (module doc); NaN where ``seeds_needed`` is NaN or n < 2."""
    low, high = sd_interval(sd, n, level)
    return seeds_needed(delta, low, power, alpha), seeds_needed(delta, high, power, alpha)
