"""Tests for cdscope.analysis.spectral against the properties and formulas of SPEC §3 and §4."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from cdscope.analysis import spectral as sp

SETTINGS = settings(max_examples=60, deadline=None)
TOL = 1e-9


@st.composite
def matrices(draw, min_m: int = 2, max_m: int = 6, max_k: int = 20) -> np.ndarray:
    M = draw(st.integers(min_m, max_m))
    K = draw(st.integers(1, max_k))
    elems = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    X = draw(arrays(np.float64, (M, K), elements=elems))
    assume(np.sum(X**2) > 1e-6)
    return X


def _orthogonal(K: int, rng: np.random.Generator) -> np.ndarray:
    Q, Rr = np.linalg.qr(rng.standard_normal((K, K)))
    return Q * np.sign(np.diag(Rr))


def _eig_moment_ratio(X: np.ndarray) -> float:
    """Slow twin of R: sum_i (lambda_i / sum_j lambda_j)^2 from eigvalsh."""
    lam = np.linalg.eigvalsh(X @ X.T)
    return float(np.sum((lam / lam.sum()) ** 2))


# ------------------------------------------------------------------------- B_shared


@SETTINGS
@given(matrices())
def test_b_shared_and_r_bounds(X):
    M = X.shape[0]
    for value in (sp.b_shared(X), sp.moment_ratio(X)):
        assert 1.0 / M - TOL <= value <= 1.0 + TOL


@SETTINGS
@given(matrices())
def test_b_shared_matches_largest_eigenvalue_share(X):
    lam = np.linalg.eigvals(X @ X.T).real
    assert sp.b_shared(X) == pytest.approx(lam.max() / np.trace(X @ X.T), rel=1e-9, abs=1e-12)


@SETTINGS
@given(
    st.integers(1, 6),
    st.integers(1, 20),
    st.integers(0, 2**32 - 1),
)
def test_b_shared_is_one_for_rank_one(M, K, seed):
    rng = np.random.default_rng(seed)
    X = np.outer(rng.standard_normal(M), rng.standard_normal(K))
    assume(np.sum(X**2) > 1e-6)
    assert sp.b_shared(X) == pytest.approx(1.0, abs=1e-12)
    assert sp.moment_ratio(X) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("M,K", [(2, 2), (3, 7), (5, 5), (6, 20)])
def test_b_shared_is_one_over_m_for_orthogonal_equal_norm_rows(M, K):
    rows = 3.7 * _orthogonal(K, np.random.default_rng(M * 100 + K))[:M]
    assert sp.b_shared(rows) == pytest.approx(1.0 / M, abs=1e-12)
    assert sp.moment_ratio(rows) == pytest.approx(1.0 / M, abs=1e-12)
    blocks = np.kron(np.eye(M), np.ones((1, 2)))  # identity blocks: rows of norm sqrt(2)
    assert sp.b_shared(blocks) == pytest.approx(1.0 / M, abs=1e-12)


@SETTINGS
@given(matrices(), st.floats(0.01, 100.0), st.booleans(), st.integers(0, 2**32 - 1))
def test_b_shared_invariances(X, c, negate, seed):
    c = -c if negate else c
    Q = _orthogonal(X.shape[1], np.random.default_rng(seed))
    b = sp.b_shared(X)
    assert sp.b_shared(c * X) == pytest.approx(b, rel=1e-9, abs=1e-12)
    assert sp.b_shared(X @ Q) == pytest.approx(b, rel=1e-9, abs=1e-12)
    r = sp.moment_ratio(X)
    assert sp.moment_ratio(c * X) == pytest.approx(r, rel=1e-9, abs=1e-12)
    assert sp.moment_ratio(X @ Q) == pytest.approx(r, rel=1e-9, abs=1e-12)


def test_b_shared_not_invariant_to_row_scaling():
    X = np.eye(2)
    assert sp.b_shared(X) == pytest.approx(0.5)
    Y = np.diag([2.0, 1.0]) @ X  # G = diag(4, 1)
    assert sp.b_shared(Y) == pytest.approx(0.8)


def test_b_shared_batched_equals_loop():
    X = np.random.default_rng(3).standard_normal((4, 5, 3, 7))
    batched = sp.b_shared(X)
    assert batched.shape == (4, 5)
    loop = np.array([[sp.b_shared(X[i, j]) for j in range(5)] for i in range(4)])
    np.testing.assert_allclose(batched, loop, rtol=1e-13, atol=0)
    np.testing.assert_allclose(
        sp.moment_ratio(X),
        [[_eig_moment_ratio(X[i, j]) for j in range(5)] for i in range(4)],
        rtol=1e-12,
    )


def test_b_shared_accepts_lists_and_returns_float():
    value = sp.b_shared([[1, 0], [1, 1]])
    assert isinstance(value, float)
    # G = [[1, 1], [1, 2]]: lambda_1 = (3 + sqrt 5) / 2, tr = 3
    assert value == pytest.approx((3 + np.sqrt(5)) / 6, abs=1e-15)


@pytest.mark.parametrize(
    "fn", [sp.b_shared, sp.moment_ratio, sp.r_sensitivity, sp.b_norm, sp.b_dir]
)
def test_zero_matrix_raises(fn):
    with pytest.raises(ValueError):
        fn(np.zeros((3, 4)))


@pytest.mark.parametrize("fn", [sp.b_dir, sp.row_abs_cos, sp.participation_ratio])
def test_zero_row_raises_for_row_normalised_measures(fn):
    with pytest.raises(ValueError, match="zero row"):
        fn(np.array([[1.0, 2.0], [0.0, 0.0]]))


@pytest.mark.parametrize("bad", [np.ones(3), np.zeros((2, 0)), [[1.0, np.nan]], [[np.inf, 1]]])
def test_malformed_input_raises(bad):
    with pytest.raises(ValueError):
        sp.b_shared(bad)


def test_gram():
    X = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(sp.gram(X), X @ X.T)
    B = np.random.default_rng(0).standard_normal((3, 2, 4))
    np.testing.assert_allclose(sp.gram(B), B @ B.swapaxes(-1, -2), rtol=1e-14)


# ----------------------------------------------------------------------- R and W


@SETTINGS
@given(matrices())
def test_moment_ratio_equals_eigenvalue_formula(X):
    assert sp.moment_ratio(X) == pytest.approx(_eig_moment_ratio(X), rel=1e-9, abs=1e-12)


def _autograd_w(C: np.ndarray) -> np.ndarray:
    """dR/dC by torch autograd on a direct transcription of R = tr(G^2) / tr(G)^2."""
    Ct = torch.tensor(C, dtype=torch.float64, requires_grad=True)
    G = Ct @ Ct.T
    R = torch.trace(G @ G) / torch.trace(G) ** 2
    R.backward()
    return Ct.grad.numpy()


def _assert_w_close(C: np.ndarray, actual: np.ndarray, expected: np.ndarray, rel: float) -> None:
    """max |actual - expected| <= rel * max|expected|, on a floor of 1/||C||_F.

    W has units of 1/||C||; near its zeros (rank-1 C, M = 1) rounding noise is measured
    on that scale rather than relative to an entry that is itself ~0.
    """
    scale = max(np.abs(expected).max(), 1.0 / np.linalg.norm(C))
    assert np.abs(actual - expected).max() <= rel * scale


@settings(max_examples=80, deadline=None)
@given(matrices(min_m=1, max_m=6, max_k=12))
def test_r_sensitivity_equals_autograd(X):
    assume(np.sum(X**2) > 1e-3)
    W = sp.r_sensitivity(X)
    assert W.shape == X.shape
    _assert_w_close(X, W, _autograd_w(X), 1e-10)


def test_r_sensitivity_batched_and_torch_twin():
    C = np.random.default_rng(7).standard_normal((3, 4, 9))
    W = sp.r_sensitivity(C)
    for i in range(3):
        _assert_w_close(C[i], W[i], _autograd_w(C[i]), 1e-10)
    Ct = torch.tensor(C, requires_grad=True)
    Wt = sp.r_sensitivity_torch(Ct)
    assert not Wt.requires_grad and Wt.dtype == torch.float64
    np.testing.assert_allclose(Wt.numpy(), W, rtol=1e-12, atol=1e-16)
    W32 = sp.r_sensitivity_torch(torch.tensor(C, dtype=torch.float32))
    assert W32.dtype == torch.float32
    np.testing.assert_allclose(W32.numpy(), W, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError):
        sp.r_sensitivity_torch(torch.zeros(2, 3))


def test_r_sensitivity_vanishes_at_extremes():
    # R is maximal (= 1) on rank-1 matrices and minimal on orthogonal equal-norm rows:
    # both are stationary points, so W = 0 there.
    rank1 = np.outer([1.0, -2.0, 0.5], [0.3, 1.0, 2.0, -1.0])
    np.testing.assert_allclose(sp.r_sensitivity(rank1), 0.0, atol=1e-14)
    np.testing.assert_allclose(sp.r_sensitivity(np.eye(3, 5)), 0.0, atol=1e-14)


# ------------------------------------------------------------- B_dir, B_norm, PR, cos


@SETTINGS
@given(matrices(), st.integers(0, 2**32 - 1))
def test_b_dir_invariant_to_row_scaling(X, seed):
    assume(np.all(np.linalg.norm(X, axis=1) > 1e-3))
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.1, 10.0, X.shape[0]) * rng.choice([-1.0, 1.0], X.shape[0])
    b = sp.b_dir(X)
    assert 1.0 / X.shape[0] - TOL <= b <= 1.0 + TOL
    assert sp.b_dir(scale[:, None] * X) == pytest.approx(b, rel=1e-9, abs=1e-12)


def test_b_dir_is_b_shared_of_cosine_matrix():
    C = np.random.default_rng(11).standard_normal((4, 6))
    U = C / np.linalg.norm(C, axis=1, keepdims=True)
    lam_max = np.linalg.eigvalsh(U @ U.T)[-1]
    assert sp.b_dir(C) == pytest.approx(lam_max / 4, rel=1e-13)


@SETTINGS
@given(matrices())
def test_b_norm_matches_loop(X):
    d = [sum(float(x) ** 2 for x in row) for row in X]
    assert sp.b_norm(X) == pytest.approx(max(d) / sum(d), rel=1e-12)


def test_b_norm_batched():
    C = np.random.default_rng(5).standard_normal((6, 3, 4))
    np.testing.assert_allclose(sp.b_norm(C), [sp.b_norm(c) for c in C], rtol=1e-14)


@SETTINGS
@given(matrices(min_m=1))
def test_participation_ratio_bounds(X):
    assume(np.all(np.sum(X**2, axis=1) > 1e-6))
    pr = sp.participation_ratio(X)
    assert pr.shape == (X.shape[0],)
    assert np.all(pr >= 1.0 - TOL) and np.all(pr <= X.shape[1] + TOL)


def test_participation_ratio_extremes_and_formula():
    K = 7
    one_hot = np.zeros((1, K))
    one_hot[0, 3] = -2.5
    assert sp.participation_ratio(one_hot)[0] == pytest.approx(1.0)
    equal = np.full((1, K), 0.4) * np.array([1, -1, 1, 1, -1, 1, -1])
    assert sp.participation_ratio(equal)[0] == pytest.approx(K)
    assert sp.participation_ratio([[1.0, 2.0, -2.0]])[0] == pytest.approx(25.0 / 9.0)


def test_row_abs_cos_and_pairs():
    C = np.array([[1.0, 0.0], [1.0, 1.0], [-2.0, 0.0]])
    expected = np.array(
        [[1, 1 / np.sqrt(2), 1], [1 / np.sqrt(2), 1, 1 / np.sqrt(2)], [1, 1 / np.sqrt(2), 1]]
    )
    np.testing.assert_allclose(sp.row_abs_cos(C), expected, atol=1e-15)
    pairs = sp.pairwise_abs_cos(C, ["a", "b", "c"])
    assert [(i, j) for i, j, _ in pairs] == [("a", "b"), ("a", "c"), ("b", "c")]
    np.testing.assert_allclose([v for *_, v in pairs], [1 / np.sqrt(2), 1, 1 / np.sqrt(2)])
    with pytest.raises(ValueError):
        sp.pairwise_abs_cos(C, ["a", "b"])


def test_acg():
    F = np.ones((3, 4))  # rank 1 -> B_shared = 1
    C = np.eye(3, 4)  # orthogonal equal norms -> 1/3
    assert sp.acg(F, C) == pytest.approx(2.0 / 3.0)


# --------------------------------------------------------------- random reference


def test_random_reference_matches_slow_loop_and_is_chunk_invariant():
    M, K, T, seed = 3, 56, 2000, 123
    ref = sp.random_reference(M, K, T, seed=seed)
    rng = np.random.default_rng(seed)
    slow = np.array([sp.b_shared(rng.standard_normal((M, K))) for _ in range(T)])
    np.testing.assert_allclose(ref.samples, slow, rtol=1e-12, atol=0)
    chunked = sp.random_reference(M, K, T, seed=seed, chunk=7)
    np.testing.assert_allclose(chunked.samples, ref.samples, rtol=1e-12, atol=0)
    assert ref.mean == pytest.approx(slow.mean(), rel=1e-12)
    assert ref.std == pytest.approx(slow.std(), rel=1e-9)
    assert ref.p95 == pytest.approx(np.percentile(slow, 95), rel=1e-12)
    assert (ref.M, ref.K, ref.trials, ref.seed) == (M, K, T, seed)


def test_random_reference_default_size_statistics():
    ref = sp.random_reference(3, 56, 50_000, seed=0)
    other = sp.random_reference(3, 56, 50_000, seed=1)
    # Far above the 1/M = 0.333 bound; the two seeds agree within Monte-Carlo error.
    assert 0.41 < ref.mean < 0.45
    assert abs(ref.mean - other.mean) < 5 * np.sqrt(2) * ref.std / np.sqrt(50_000)
    assert ref.samples.min() >= 1.0 / 3.0 and ref.samples.max() <= 1.0
    assert ref.mean < ref.p95 <= ref.p99 <= ref.samples.max()


def test_random_reference_percentile_of():
    ref = sp.random_reference(4, 10, 5000, seed=2)
    grid = np.linspace(0.2, 1.0, 81)
    pct = [ref.percentile_of(v) for v in grid]
    assert all(a <= b for a, b in zip(pct, pct[1:], strict=False))
    assert ref.percentile_of(0.0) == 0.0
    assert ref.percentile_of(ref.samples.max()) == 100.0
    assert ref.percentile_of(ref.p95) == pytest.approx(95.0, abs=0.05)
    assert ref.percentile_of(np.median(ref.samples)) == pytest.approx(50.0, abs=0.05)


def test_random_reference_samples_are_read_only():
    ref = sp.random_reference(2, 3, 10)
    with pytest.raises(ValueError):
        ref.samples[0] = 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(M=3, K=5, trials=0),
        dict(M=0, K=5, trials=10),
        dict(M=3, K=0, trials=10),
        dict(M=3, K=5, trials=-1),
        dict(M=3, K=5, trials=10, chunk=0),
        dict(M=2.5, K=5, trials=10),
    ],
)
def test_random_reference_validation(kwargs):
    with pytest.raises(ValueError):
        sp.random_reference(**kwargs)
