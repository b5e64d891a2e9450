"""Tests for cdscope.analysis.stats: the seed-level protocol of SPEC §4 and the bootstrap of §6."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps
from scipy.special import nctdtr

from cdscope.analysis import stats as cs
from cdscope.analysis.spectral import b_shared
from cdscope.analysis.uncertainty import FamilySamples, bootstrap_intervals

finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


# ------------------------------------------------------------------------- mean_se


def test_mean_se_by_hand():
    mean, se = cs.mean_se([1.0, 2.0, 4.0, 9.0])
    assert mean == pytest.approx(4.0)
    # deviations -3, -2, 0, 5 -> sum of squares 38, variance 38/3, SE = sqrt(38/3)/2
    assert se == pytest.approx(math.sqrt(38.0 / 3.0) / 2.0, rel=1e-14)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=2, max_size=30))
def test_mean_se_matches_manual_formula(values):
    S = len(values)
    m = sum(values) / S
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (S - 1))
    mean, se = cs.mean_se(values)
    assert mean == pytest.approx(m, rel=1e-9, abs=1e-6)
    assert se == pytest.approx(sd / math.sqrt(S), rel=1e-7, abs=1e-6)


def test_mean_se_single_value_and_errors():
    mean, se = cs.mean_se([3.5])
    assert mean == 3.5 and math.isnan(se)
    with pytest.raises(ValueError):
        cs.mean_se([])
    with pytest.raises(ValueError):
        cs.mean_se([[1.0, 2.0]])


# --------------------------------------------------------------- paired_difference


def test_paired_difference_against_hand_computed_t_interval():
    a = np.array([0.80, 0.75, 0.90, 0.70, 0.85])
    b = np.array([0.70, 0.78, 0.60, 0.65, 0.80])
    d = a - b  # 0.10, -0.03, 0.30, 0.05, 0.05
    res = cs.paired_difference(a, b)
    S = 5
    mean = d.sum() / S
    se = math.sqrt(((d - mean) ** 2).sum() / (S - 1)) / math.sqrt(S)
    t = sps.t.ppf(0.975, S - 1)  # 2.776...
    assert t == pytest.approx(2.7764451, rel=1e-6)
    assert res.n == S
    assert res.mean == pytest.approx(0.094, rel=1e-12)
    assert res.se == pytest.approx(se, rel=1e-12)
    assert res.n_negative == 1
    assert res.ci_low == pytest.approx(mean - t * se, rel=1e-12)
    assert res.ci_high == pytest.approx(mean + t * se, rel=1e-12)
    np.testing.assert_allclose(res.deltas, d, rtol=1e-15)


def test_paired_difference_matches_scipy_interval_and_level():
    rng = np.random.default_rng(4)
    a, b = rng.normal(0.3, 1.0, 12), rng.normal(0.0, 1.0, 12)
    d = a - b
    for level in (0.9, 0.95, 0.99):
        res = cs.paired_difference(a, b, level=level)
        lo, hi = sps.t.interval(level, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
        assert (res.ci_low, res.ci_high) == pytest.approx((lo, hi), rel=1e-12)
    assert cs.paired_difference(a, b).n_negative == int(np.sum(d < 0))


def test_paired_difference_single_seed_and_zero_deltas():
    res = cs.paired_difference([1.0], [2.0])
    assert res.n == 1 and res.mean == -1.0 and res.n_negative == 1
    assert math.isnan(res.se) and math.isnan(res.ci_low) and math.isnan(res.ci_high)
    same = cs.paired_difference([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert same.n_negative == 0 and same.se == 0.0 and same.ci_low == same.ci_high == 0.0


def test_paired_difference_errors():
    with pytest.raises(ValueError, match="equal lengths"):
        cs.paired_difference([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        cs.paired_difference([1.0, 2.0], [1.0, 2.0], level=1.0)


# ---------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_contains_mean_and_is_deterministic():
    x = np.random.default_rng(0).normal(5.0, 2.0, 200)
    res = cs.bootstrap_ci(x, seed=1)
    assert res.estimate == pytest.approx(x.mean())
    assert res.ci_low < x.mean() < res.ci_high
    # Width close to the normal-theory interval 2 * 1.96 * SE.
    se = x.std(ddof=1) / np.sqrt(x.size)
    assert res.ci_high - res.ci_low == pytest.approx(2 * 1.96 * se, rel=0.15)
    again = cs.bootstrap_ci(x, seed=1)
    assert (again.ci_low, again.ci_high) == (res.ci_low, res.ci_high)
    other = cs.bootstrap_ci(x, seed=2)
    assert (other.ci_low, other.ci_high) != (res.ci_low, res.ci_high)
    assert res.B == 2000 and res.level == 0.95


def test_bootstrap_ci_matches_explicit_resampling_loop():
    x = np.random.default_rng(9).exponential(1.0, 15)
    B, seed = 300, 5
    idx = np.random.default_rng(seed).integers(0, x.size, size=(B, x.size))
    boot = [np.median(x[row]) for row in idx]
    lo, mid, hi = np.quantile(boot, [0.05, 0.5, 0.95])
    res = cs.bootstrap_ci(x, stat=np.median, B=B, seed=seed, level=0.9, method="percentile")
    assert res.ci_low == pytest.approx(lo, rel=1e-14)
    assert res.ci_high == pytest.approx(hi, rel=1e-14)
    assert res.estimate == pytest.approx(np.median(x))
    centred = cs.bootstrap_ci(x, stat=np.median, B=B, seed=seed, level=0.9)
    assert centred.method == "centred"  # the default
    shift = np.median(x) - mid
    assert centred.ci_low == pytest.approx(lo + shift, rel=1e-14)
    assert centred.ci_high == pytest.approx(hi + shift, rel=1e-14)


def _b_shared_draws(rows: np.ndarray, B: int, seed: int) -> np.ndarray:
    """The audit's bootstrap of B_shared, written out: each family's n samples resampled
    independently, C = family means, B_shared = lambda_1 / tr of C C^T by eigvalsh."""
    rng = np.random.default_rng(seed)
    M, n, _ = rows.shape  # noqa: N806
    out = []
    for _ in range(B):
        C = np.stack([rows[m, rng.integers(0, n, n)].mean(axis=0) for m in range(M)])
        w = np.linalg.eigvalsh(C @ C.T)
        out.append(w[-1] / w.sum())
    return np.array(out)


def test_bootstrap_interval_contains_the_estimate_where_the_percentile_one_does_not():
    """B_shared of 3 families x n = 3 probe samples, resampled within families (as the
    audit does): the bootstrap values sit mostly below the estimate; the percentile
    interval excludes it, the centred one keeps the same width around it."""
    rng = np.random.default_rng(14)  # one of 80 draws searched; 99 % of its values lie below
    shared = rng.standard_normal(12)
    rows = np.stack([s * shared + 1.5 * rng.standard_normal((3, 12)) for s in (1.0, 1.4, 0.8)])
    C = rows.mean(axis=1)
    w = np.linalg.eigvalsh(C @ C.T)
    estimate = w[-1] / w.sum()
    draws = _b_shared_draws(rows, 1000, 0)
    assert np.mean(draws < estimate) > 0.975  # the resampling bias, not a rare draw
    lo, hi = cs.bootstrap_interval(draws, estimate, method="percentile")
    assert hi < estimate  # what the percentile interval reports
    c_lo, c_hi = cs.bootstrap_interval(draws, estimate)
    assert c_lo <= estimate <= c_hi
    assert c_hi - c_lo == pytest.approx(hi - lo, rel=1e-12)


def test_audit_bootstrap_contains_the_value_it_is_drawn_around():
    """The audit's per-seed interval (uncertainty.bootstrap_intervals): 3 families x n = 3
    samples where the percentile interval misses B_shared (one of 48 such probes in 200
    synthetic draws); given the full-sample value, the interval contains it."""
    rng = np.random.default_rng(3)
    shared, sets = rng.standard_normal(60), []
    for _ in range(3):
        logp = -rng.uniform(5, 30, 3)
        scale = shared * rng.uniform(0.5, 2) + rng.standard_normal((3, 60)) * rng.uniform(0.5, 3)
        sets.append(FamilySamples(logp, scale * 0.1 * np.abs(logp)[:, None], np.ones((3, 60))))
    C = np.stack([s.dlogp.mean(axis=0) / s.logp.mean() for s in sets])
    w = np.linalg.eigvalsh(C @ C.T)
    value = {"B_shared_C": w[-1] / w.sum()}

    def measure(families, C, F):  # noqa: N803, ANN001
        return {"B_shared_C": float(b_shared(C))}

    plain = bootstrap_intervals(["a", "b", "c"], sets, measure, (), B=500, seed=0)
    assert plain["B_shared_C"][1] < value["B_shared_C"]  # the percentile interval misses it
    lo, hi = bootstrap_intervals(["a", "b", "c"], sets, measure, (), 500, 0, estimates=value)[
        "B_shared_C"
    ]
    assert lo <= value["B_shared_C"] <= hi
    assert hi - lo == pytest.approx(plain["B_shared_C"][1] - plain["B_shared_C"][0], rel=1e-12)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40),
    finite,
    st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
def test_centred_interval_always_contains_the_estimate(draws, estimate, level):
    lo, hi = cs.bootstrap_interval(draws, estimate, level)
    assert lo <= estimate <= hi
    p_lo, p_hi = cs.bootstrap_interval(draws, estimate, level, "percentile")
    assert hi - lo == pytest.approx(p_hi - p_lo, rel=1e-9, abs=1e-6)


def test_bootstrap_interval_drops_non_finite_draws_and_checks_its_method():
    lo, hi = cs.bootstrap_interval([1.0, np.nan, 2.0, np.inf, 3.0], 2.0, method="percentile")
    assert (lo, hi) == pytest.approx(tuple(np.quantile([1.0, 2.0, 3.0], [0.025, 0.975])))
    assert all(math.isnan(v) for v in cs.bootstrap_interval([np.nan, np.inf], 1.0))
    assert all(math.isnan(v) for v in cs.bootstrap_interval([1.0, 2.0], float("nan")))
    with pytest.raises(ValueError, match="method"):
        cs.bootstrap_interval([1.0], 1.0, method="bca")


def test_bootstrap_ci_constant_sample_and_errors():
    res = cs.bootstrap_ci([2.0] * 10)
    assert res.ci_low == res.ci_high == res.estimate == 2.0
    with pytest.raises(ValueError):
        cs.bootstrap_ci([])
    with pytest.raises(ValueError):
        cs.bootstrap_ci([1.0, 2.0], B=0)
    with pytest.raises(ValueError):
        cs.bootstrap_ci([1.0, 2.0], level=0.0)


def test_paired_bootstrap_ci():
    rng = np.random.default_rng(3)
    base = rng.normal(0.0, 5.0, 100)  # large shared component, small paired shift
    a, b = base + 0.5 + rng.normal(0, 0.2, 100), base
    res = cs.paired_bootstrap_ci(a, b, seed=0)
    assert res.estimate == pytest.approx(np.mean(a - b))
    assert 0.0 < res.ci_low < res.estimate < res.ci_high  # pairing removes the shared noise
    direct = cs.bootstrap_ci(a - b, seed=0)
    assert (res.ci_low, res.ci_high) == (direct.ci_low, direct.ci_high)
    with pytest.raises(ValueError, match="equal lengths"):
        cs.paired_bootstrap_ci(a, b[:-1])


# -- power of the paired t-test and seeds needed ---------------------------------------


@pytest.mark.parametrize(("effect", "table"), [(0.2, 199), (0.5, 34), (0.8, 15), (1.0, 10)])
def test_seeds_needed_matches_the_published_table(effect: float, table: int) -> None:
    """One-sample/paired t-test, two-sided alpha 0.05, power 0.8 (Cohen 1988; G*Power)."""
    assert cs.seeds_needed(effect * 0.03, 0.03) == table
    assert cs.paired_t_power(effect, 1.0, table) >= 0.8 > cs.paired_t_power(effect, 1.0, table - 1)


def test_paired_t_power_agrees_with_monte_carlo() -> None:
    rng = np.random.default_rng(0)
    delta, sd, S, reps = 0.05, 0.06, 9, 40_000  # noqa: N806
    d = delta + sd * rng.standard_normal((reps, S))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(S))
    rejected = np.mean(np.abs(t) > sps.t.ppf(0.975, S - 1))
    power = cs.paired_t_power(delta, sd, S)
    assert abs(rejected - power) < 4 * np.sqrt(power * (1 - power) / reps)
    # and against scipy's noncentral t (the closed form, computed independently)
    nc = delta * np.sqrt(S) / sd
    crit = sps.t.ppf(0.975, S - 1)
    assert power == pytest.approx(sps.nct.sf(crit, S - 1, nc) + sps.nct.cdf(-crit, S - 1, nc))


def test_power_survives_scipys_nan_tails() -> None:
    """scipy's nctdtr returns NaN where a tail underflows (df 1, nc 70.7: the lower tail at
    -t_crit); power must stay a probability, non-decreasing in the effect, and a huge
    effect needs 2 seeds, not 3."""
    assert np.isnan(nctdtr(1, 0.05 * np.sqrt(2) / 0.001, -sps.t.ppf(0.975, 1)))  # the trap
    assert cs.paired_t_power(0.05, 0.001, 2) == pytest.approx(1.0, abs=1e-7)
    assert cs.seeds_needed(0.05, 0.001) == 2
    for seeds in (2, 3, 4, 6, 11, 51):
        power = [cs.paired_t_power(d, 1.0, seeds) for d in np.geomspace(1e-2, 2e3, 400)]
        assert np.isfinite(power).all(), seeds
        assert np.all(np.diff(power) >= 0.0), seeds  # measured: smallest step exactly 0
        assert min(power) >= 0.05 and max(power) <= 1.0


def test_seeds_needed_edge_cases() -> None:
    assert math.isnan(cs.seeds_needed(0.05, float("nan")))
    assert math.isnan(cs.seeds_needed(0.0, 0.1))
    assert cs.seeds_needed(0.05, 0.0) == 2
    assert cs.seeds_needed(1e-6, 1.0, max_seeds=1000) == float("inf")
    with pytest.raises(ValueError, match="at least 2"):
        cs.paired_t_power(0.1, 0.1, 1)


# -- the SD's own uncertainty propagated to seeds needed (issue 36) ----------------------


@pytest.mark.parametrize("n", [2, 3, 5, 30])
def test_sd_interval_is_the_chi_square_interval(n: int) -> None:
    """Twin: scipy.stats.chi2 quantiles; the interval contains the sample SD."""
    low, high = cs.sd_interval(7.5, n)
    df = n - 1
    assert low == pytest.approx(7.5 * math.sqrt(df / sps.chi2.ppf(0.975, df)), rel=1e-12)
    assert high == pytest.approx(7.5 * math.sqrt(df / sps.chi2.ppf(0.025, df)), rel=1e-12)
    assert low < 7.5 < high
    assert all(math.isnan(x) for x in cs.sd_interval(7.5, 1) + cs.sd_interval(math.nan, 5))


def test_sd_interval_covers_the_true_sd_95_percent_of_the_time() -> None:
    """20,000 normal samples of 3 values: the true SD lies inside in 95 % of them (binomial
    SE 0.15 %; measured 95.0 %)."""
    draws = np.random.default_rng(0).normal(0.0, 2.0, size=(20_000, 3))
    inside = [
        low <= 2.0 <= high
        for low, high in (cs.sd_interval(s, 3) for s in draws.std(axis=1, ddof=1))
    ]
    assert np.mean(inside) == pytest.approx(0.95, abs=0.006)


def test_seeds_needed_range_at_three_seeds_is_the_issues() -> None:
    """Issue 36: 3 seeds, SD of Delta 7.5 points, the paper's target 5.5 points: 17 seeds,
    plausibly anywhere from 7 to 579 (the SD's 95 % chi-square interval, 3.9 to 47.1)."""
    assert cs.seeds_needed(5.5, 7.5) == 17
    assert cs.seeds_needed_interval(5.5, 7.5, 3) == (7, 579)
    low, high = cs.seeds_needed_interval(5.5, 7.5, 30)  # more seeds: a narrower range
    assert 7 < low < 17 < high < 579
    assert all(math.isnan(x) for x in cs.seeds_needed_interval(math.nan, 7.5, 3))
