"""Unbiased pass@k (SPEC §7) against brute-force enumeration of k-subsets, and aggregation."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdscope.analysis.passk import check_ks, pass_at_k, summarize
from cdscope.errors import CdscopeError


def brute_force(n: int, c: int, k: int) -> float:
    """Share of all k-subsets of n samples (c of them passing) that contain a pass."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


def test_matches_enumeration_of_all_k_subsets() -> None:
    cases = [(n, c, k) for n in range(1, 11) for c in range(n + 1) for k in range(1, n + 1)]
    n = np.array([case[0] for case in cases])
    c = np.array([case[1] for case in cases])
    for k in range(1, 11):
        rows = [i for i, case in enumerate(cases) if case[2] == k]
        got = pass_at_k(n[rows], c[rows], [k])[:, 0]
        want = [brute_force(*cases[i]) for i in rows]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.floats(0, 1)), min_size=1, max_size=12))
def test_vectorised_over_problems_and_k_equals_the_binomial_formula(problems) -> None:
    n = np.array([p[0] for p in problems])
    c = np.array([round(p[1] * p[0]) for p in problems])
    ks = sorted({1, int(n.min()), max(1, int(n.min()) // 2)})
    got = pass_at_k(n, c, ks)
    for row, (ni, ci) in enumerate(zip(n, c, strict=True)):
        for j, k in enumerate(ks):
            want = 1 - math.comb(int(ni - ci), k) / math.comb(int(ni), k)
            assert got[row, j] == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_large_n_stays_finite_and_exact_at_the_edges() -> None:
    got = pass_at_k(np.array([2000, 2000, 2000]), np.array([0, 1, 2000]), [1, 100])
    assert got[0].tolist() == [0.0, 0.0] and got[2].tolist() == [1.0, 1.0]
    np.testing.assert_allclose(got[1], [1 / 2000, 100 / 2000], rtol=1e-12)


def test_n_below_max_k_is_refused_with_the_reason() -> None:
    with pytest.raises(CdscopeError, match=r"pass@5 needs at least 5 samples .* n=4"):
        pass_at_k(np.array([4, 8]), np.array([1, 2]), [1, 5])
    with pytest.raises(CdscopeError, match="k >= 1"):
        check_ks([0, 1], 4)
    with pytest.raises(CdscopeError, match="passes"):
        pass_at_k(np.array([4]), np.array([5]), [1])


def _frame(rows: list[tuple[str, str, str, str, list[bool]]]) -> pd.DataFrame:
    records = []
    for model, domain, bench, pid, outcomes in rows:
        for i, ok in enumerate(outcomes):
            records.append(
                dict(
                    model=model, domain=domain, benchmark=bench, problem_id=pid, sample=i, passed=ok
                )
            )
    return pd.DataFrame(records)


def test_benchmark_domain_overall_and_hard_means() -> None:
    samples = _frame(
        [
            ("m", "math", "gsm", "g1", [True, False, False, False]),
            ("m", "math", "gsm", "g2", [False] * 4),
            ("m", "math", "arith", "a1", [True] * 4),
            ("m", "code", "he", "h1", [True, True, False, False]),
        ]
    )
    out = summarize(samples, [1, 2], hard_ids={"g2", "h1"}).set_index(
        ["subset", "level", "domain", "benchmark", "k"]
    )
    p = out["pass_at_k"]
    g1_k2 = 1 - math.comb(3, 2) / math.comb(4, 2)  # 0.5
    h1_k2 = 1 - math.comb(2, 2) / math.comb(4, 2)
    assert p["all", "benchmark", "math", "gsm", 1] == pytest.approx(0.125)
    assert p["all", "benchmark", "math", "gsm", 2] == pytest.approx(g1_k2 / 2)
    assert p["all", "domain", "math", "", 1] == pytest.approx((0.125 + 1.0) / 2)
    assert p["all", "domain", "code", "", 2] == pytest.approx(h1_k2)
    assert p["all", "overall", "", "", 1] == pytest.approx(((0.125 + 1.0) / 2 + 0.5) / 2)
    assert p["hard", "domain", "math", "", 1] == 0.0
    assert p["hard", "overall", "", "", 1] == pytest.approx(0.25)
    assert out.loc[("all", "overall", "", "", 1), "problems"] == 4
    assert ("hard", "benchmark", "math", "arith", 1) not in p.index


def test_uneven_samples_refuse_when_one_problem_has_too_few() -> None:
    samples = _frame([("m", "math", "b", "p1", [True] * 5), ("m", "math", "b", "p2", [True] * 2)])
    with pytest.raises(CdscopeError, match="n=2"):
        summarize(samples, [1, 4])
    assert len(summarize(samples, [1, 2])) == 2 * 3
