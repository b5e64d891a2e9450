"""Spectral measures of control and activation matrices (SPEC §3, random reference §4).

A matrix X has one row per task family (M rows) and one column per gate (K columns);
leading batch axes are allowed everywhere, so X has shape ``[..., M, K]`` and every
function is vectorised over the batch. With the Gram matrix ``G = X X^T`` (M x M,
symmetric positive semi-definite, eigenvalues lambda_1 >= ... >= lambda_M >= 0):

* ``B_shared(X) = lambda_1 / tr(G)`` -- the share of the total squared mass carried by
  the top direction. It lies in [1/M, 1]: 1 iff the rows are collinear, 1/M iff they
  are orthogonal with equal norms. It is invariant to X -> cX and X -> XQ (Q
  orthogonal) but *not* to rescaling individual rows.
* ``R(X) = tr(G^2) / tr(G)^2 = sum_i (lambda_i / sum_j lambda_j)^2`` -- a smooth
  stand-in for B_shared with the same bounds, computed as ||G||_F^2 / tr(G)^2 without
  any eigendecomposition.
* ``W = dR/dC = 4 / tr(G)^2 * (G C - R tr(G) C)`` -- the closed-form sensitivity used
  by the regulariser (SPEC §5). One generic implementation serves numpy and torch.
* ``B_dir`` (direction sharing: B_shared of the row-normalised matrix, i.e.
  lambda_max of the row-cosine matrix over M), ``B_norm`` (largest share of the
  squared row norms), |cos| between rows, the participation ratio of each row and its
  cumulative |C| mass curve.
* ``ACG = B_shared(F) - B_shared(C)``, the activation-control gap.

The random reference (SPEC §4) is the distribution of B_shared over M x K matrices with
i.i.d. standard Gaussian entries; its mean sits well above the 1/M bound.

These are the plain estimators of the SPEC. Their noise-corrected twins (measures of the
unbiased U-statistic Gram of per-sample contributions, SPEC §4) live in ``cdscope.analysis.noise``.

Everything is computed in float64. Quantities that divide by tr(G) or by a row norm
raise ``ValueError`` when that denominator is zero rather than returning NaN.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

if TYPE_CHECKING:
    import torch

__all__ = [
    "RandomReference",
    "acg",
    "b_dir",
    "b_norm",
    "b_shared",
    "cumulative_mass",
    "gram",
    "moment_ratio",
    "moment_ratio_torch",
    "pairwise_abs_cos",
    "participation_ratio",
    "r_sensitivity",
    "r_sensitivity_torch",
    "random_reference",
    "row_abs_cos",
    "top_share",
]

# Memory bound for one chunk of the random reference: about 32 MiB of float64 draws.
_CHUNK_ELEMENTS = 1 << 22
#: from this K on, the random reference draws G = X X^T directly (Bartlett), not X
BARTLETT_K = 4096


# --------------------------------------------------------------------------- helpers


def _as_matrix(X: ArrayLike, name: str = "X") -> np.ndarray:
    """X as a finite float64 array of shape [..., M, K] with M, K >= 1."""
    arr = np.asarray(X, dtype=np.float64)
    if arr.ndim < 2:
        raise ValueError(f"{name} must have shape [..., M, K]; got shape {arr.shape}")
    if arr.shape[-2] < 1 or arr.shape[-1] < 1:
        raise ValueError(f"{name} needs M >= 1 rows and K >= 1 columns; got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or infinite entries")
    return arr


def _require_nonzero_trace(tr: np.ndarray, name: str) -> None:
    if np.any(tr <= 0.0):
        raise ValueError(f"{name}: tr(X X^T) = 0 (an all-zero matrix), so the measure is undefined")


def _unit_rows(C: np.ndarray, name: str) -> np.ndarray:
    """Rows of C scaled to unit Euclidean norm; a zero row has no direction."""
    norms = np.linalg.norm(C, axis=-1, keepdims=True)
    if np.any(norms <= 0.0):
        raise ValueError(f"{name}: C has an all-zero row, whose direction is undefined")
    return C / norms


def _scalar_or_array(x: np.ndarray) -> np.ndarray | float:
    """A 0-d result as a Python float, anything else unchanged."""
    return float(x) if np.ndim(x) == 0 else x


def _moments(X: Any, xp: ModuleType) -> tuple[Any, Any, Any]:
    """(G, tr(G), R) for X of shape [..., M, K]; ``xp`` is numpy or torch.

    The single implementation of R shared by the numpy and torch entry points:
    tr(G) = sum_mk X_mk^2 and tr(G^2) = ||G||_F^2 = sum_ij G_ij^2.
    """
    G = xp.einsum("...mk,...nk->...mn", X, X)
    tr = xp.einsum("...mk,...mk->...", X, X)
    tr_g2 = xp.einsum("...ij,...ij->...", G, G)
    return G, tr, tr_g2 / tr**2


def _sensitivity(C: Any, xp: ModuleType) -> Any:
    """W = 4 / tr(G)^2 * (G C - R tr(G) C) for numpy or torch arrays (SPEC §3)."""
    G, tr, R = _moments(C, xp)
    tr_ = tr[..., None, None]
    R_ = R[..., None, None]
    return 4.0 / tr_**2 * (G @ C - R_ * tr_ * C)


# --------------------------------------------------------------------- core measures


def gram(X: ArrayLike) -> np.ndarray:
    """Gram matrix ``G = X X^T`` of shape [..., M, M] (SPEC §3)."""
    A = _as_matrix(X)
    return np.einsum("...mk,...nk->...mn", A, A)


def b_shared(X: ArrayLike) -> np.ndarray | float:
    """Shared control bottleneck ``B_shared(X) = lambda_1(G) / tr(G)``, G = X X^T (SPEC §3).

    lambda_1 is the largest eigenvalue of G (``np.linalg.eigvalsh``, batched); the value
    lies in [1/M, 1] up to rounding. Returns shape [...] (a float for a single matrix).
    Raises ValueError if some tr(G) = 0.
    """
    A = _as_matrix(X)
    tr = np.einsum("...mk,...mk->...", A, A)
    _require_nonzero_trace(tr, "b_shared")
    lam_max = np.linalg.eigvalsh(np.einsum("...mk,...nk->...mn", A, A))[..., -1]
    return _scalar_or_array(lam_max / tr)


def moment_ratio(X: ArrayLike) -> np.ndarray | float:
    """Spectral-moment ratio ``R(X) = tr(G^2) / tr(G)^2 = sum_i (lambda_i / sum_j lambda_j)^2``.

    Computed as ||G||_F^2 / tr(G)^2, with no eigendecomposition (SPEC §3). Same bounds
    as B_shared: [1/M, 1]. Raises ValueError if some tr(G) = 0.
    """
    A = _as_matrix(X)
    _require_nonzero_trace(np.einsum("...mk,...mk->...", A, A), "moment_ratio")
    return _scalar_or_array(_moments(A, np)[2])


def r_sensitivity(C: ArrayLike) -> np.ndarray:
    """Closed-form gradient ``W = dR/dC = 4 / tr(G)^2 * (G C - R tr(G) C)`` (SPEC §3, §5).

    Evaluated at the given (stop-gradient) C with G = C C^T and R = R(C); shape
    [..., M, K], float64. Raises ValueError if some tr(G) = 0.
    """
    A = _as_matrix(C, "C")
    _require_nonzero_trace(np.einsum("...mk,...mk->...", A, A), "r_sensitivity")
    return _sensitivity(A, np)


def r_sensitivity_torch(C: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`r_sensitivity`: ``W = 4 / tr(G)^2 * (G C - R tr(G) C)``.

    For training code (SPEC §5): C is detached (W is a stop-gradient quantity), the
    formula is evaluated in float64 on C's device, and W is returned in C's dtype.
    Raises ValueError if some tr(G) = 0.
    """
    import torch

    Cd = C.detach().to(torch.float64)
    if Cd.ndim < 2:
        raise ValueError(f"C must have shape [..., M, K]; got shape {tuple(Cd.shape)}")
    if bool((torch.einsum("...mk,...mk->...", Cd, Cd) <= 0).any()):
        raise ValueError(
            "r_sensitivity_torch: tr(C C^T) = 0 (an all-zero matrix), so W is undefined"
        )
    return _sensitivity(Cd, torch).to(C.dtype)


def moment_ratio_torch(C: torch.Tensor) -> torch.Tensor:
    """Differentiable torch twin of :func:`moment_ratio` (same formula, no eigendecomposition).

    Used by the exact CD-RFT gradient, which backpropagates R(C(theta)) (SPEC §5).
    """
    import torch

    return _moments(C, torch)[2]


def b_dir(C: ArrayLike) -> np.ndarray | float:
    """Direction sharing ``B_dir(C) = lambda_max(Rcos) / M`` (SPEC §3).

    Rcos[i, j] = cos(C[i], C[j]) is the Gram matrix of the row-normalised C, whose trace
    is M, so B_dir is B_shared of the row-normalised C. Invariant to scaling any row by
    a non-zero factor. Raises ValueError if a row is all zero.
    """
    return b_shared(_unit_rows(_as_matrix(C, "C"), "b_dir"))


def b_norm(C: ArrayLike) -> np.ndarray | float:
    """Row-norm share ``B_norm(C) = max_m d_m / sum_m d_m``, d_m = ||C[m, :]||^2 (SPEC §3)."""
    A = _as_matrix(C, "C")
    d = np.einsum("...mk,...mk->...m", A, A)
    total = d.sum(axis=-1)
    _require_nonzero_trace(total, "b_norm")
    return _scalar_or_array(d.max(axis=-1) / total)


def row_abs_cos(C: ArrayLike) -> np.ndarray:
    """Matrix of ``|cos(C[i, :], C[j, :])|`` between rows, shape [..., M, M] (SPEC §3).

    Values are clipped to [0, 1] against rounding; the diagonal is 1. Raises ValueError
    if a row is all zero.
    """
    U = _unit_rows(_as_matrix(C, "C"), "row_abs_cos")
    return np.clip(np.abs(np.einsum("...mk,...nk->...mn", U, U)), 0.0, 1.0)


def pairwise_abs_cos(C: ArrayLike, names: Sequence[str]) -> list[tuple[str, str, float]]:
    """``(name_i, name_j, |cos(C[i], C[j])|)`` for every family pair i < j (SPEC §3).

    C is a single M x K matrix and ``names`` has one entry per row.
    """
    A = _as_matrix(C, "C")
    if A.ndim != 2:
        raise ValueError(f"pairwise_abs_cos takes a single M x K matrix; got shape {A.shape}")
    if len(names) != A.shape[0]:
        raise ValueError(f"got {len(names)} names for a matrix with {A.shape[0]} rows")
    cos = row_abs_cos(A)
    M = A.shape[0]
    return [(names[i], names[j], float(cos[i, j])) for i in range(M) for j in range(i + 1, M)]


def participation_ratio(C: ArrayLike) -> np.ndarray:
    """Participation ratio of each row, ``PR(C[m]) = (sum_k |C[m,k]|)^2 / sum_k C[m,k]^2``.

    Shape [..., M]; ranges from 1 (one gate carries the row) to K (all entries of equal
    magnitude) (SPEC §3). Raises ValueError if a row is all zero.
    """
    A = _as_matrix(C, "C")
    sq = np.einsum("...mk,...mk->...m", A, A)
    if np.any(sq <= 0.0):
        raise ValueError("participation_ratio: C has an all-zero row, whose PR is undefined")
    return np.abs(A).sum(axis=-1) ** 2 / sq


def cumulative_mass(C: ArrayLike) -> np.ndarray:
    """Per row, the share of ``sum_k |C[m, k]|`` carried by its ``j`` largest-|C| gates,
    j = 1..K: shape [..., M, K], non-decreasing, ending at 1. O(K log K) per row (a sort),
    never K x K. Raises ValueError if a row is all zero."""
    A = np.abs(_as_matrix(C, "C"))
    total = A.sum(axis=-1, keepdims=True)
    if np.any(total <= 0.0):
        raise ValueError("cumulative_mass: C has an all-zero row")
    return np.cumsum(-np.sort(-A, axis=-1), axis=-1) / total


def top_share(C: ArrayLike, fraction: float) -> np.ndarray:
    """Per row, the share of ``sum_k |C[m, k]|`` carried by the top ``ceil(fraction * K)``
    gates by |C| (a point of ``cumulative_mass``), shape [..., M]."""
    curve = cumulative_mass(C)
    j = max(1, int(np.ceil(fraction * curve.shape[-1])))
    return curve[..., j - 1]


def acg(F: ArrayLike, C: ArrayLike) -> np.ndarray | float:
    """Activation-control gap ``ACG = B_shared(F) - B_shared(C)`` (SPEC §3)."""
    return b_shared(F) - b_shared(C)


# ------------------------------------------------------------------ random reference


@dataclass(frozen=True, eq=False)
class RandomReference:
    """Distribution of B_shared over i.i.d. standard Gaussian M x K matrices (SPEC §4).

    ``samples`` holds one B_shared value per trial, in trial order (read-only).
    """

    M: int
    K: int
    trials: int
    seed: int
    samples: np.ndarray
    mean: float
    std: float
    p95: float
    p99: float

    def percentile_of(self, value: float) -> float:
        """Percentage (0..100) of reference samples that are <= ``value``."""
        v = float(value)
        if np.isnan(v):
            raise ValueError("percentile_of: value is NaN")
        return 100.0 * float(np.count_nonzero(self.samples <= v)) / self.trials


def _positive_int(value: int, name: str) -> int:
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer; got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be >= 1; got {n}")
    return n


def random_reference(
    M: int, K: int, trials: int = 50_000, seed: int = 0, chunk: int | None = None
) -> RandomReference:
    """B_shared of ``trials`` i.i.d. standard Gaussian M x K matrices (SPEC §4).

    Draws come from ``np.random.default_rng(seed)`` in trial order, ``chunk`` trials at
    a time (default: as many as fit in about 32 MiB), so the samples do not depend on
    the chunk size. Per chunk: G = X X^T batched, lambda_1 by batched ``eigvalsh`` on
    the [chunk, M, M] stack, B_shared = lambda_1 / tr(G).
    Reports mean, std (ddof=0), and the 95th / 99th percentiles (linear interpolation).

    Large K (>= ``BARTLETT_K``, e.g. gates per neuron): G is drawn directly from its
    Wishart_M(K, I) law by the Bartlett decomposition, G = A A^T with A lower triangular,
    A_ii = sqrt(chi^2_{K-i}), A_ij ~ N(0, 1) below the diagonal -- the same distribution
    of B_shared in O(M^2) per trial instead of O(M K) (other draws than the direct route).
    """
    M = _positive_int(M, "M")
    K = _positive_int(K, "K")
    trials = _positive_int(trials, "trials")
    bartlett = max(BARTLETT_K, M) <= K
    if chunk is None:  # X is M x K (direct route), X X^T is M x M
        chunk = max(1, _CHUNK_ELEMENTS // (M * (M if bartlett else max(M, K))))
    chunk = _positive_int(chunk, "chunk")

    rng = np.random.default_rng(seed)
    # Bartlett: diagonal and off-diagonal draws from two streams, so chunks change nothing
    chi_rng, normal_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    samples = np.empty(trials, dtype=np.float64)
    rows, cols = np.tril_indices(M, -1)
    for start in range(0, trials, chunk):
        n = min(chunk, trials - start)
        if bartlett:
            A = np.zeros((n, M, M))
            A[:, np.arange(M), np.arange(M)] = np.sqrt(chi_rng.chisquare(K - np.arange(M), (n, M)))
            A[:, rows, cols] = normal_rng.standard_normal((n, len(rows)))
            G = np.einsum("tij,tkj->tik", A, A)
        else:
            X = rng.standard_normal((n, M, K))
            G = np.einsum("tmk,tnk->tmn", X, X)
        tr = np.einsum("tii->t", G)
        samples[start : start + n] = np.linalg.eigvalsh(G)[:, -1] / tr
    samples.flags.writeable = False
    p95, p99 = np.percentile(samples, [95.0, 99.0])
    return RandomReference(
        M=M,
        K=K,
        trials=trials,
        seed=seed,
        samples=samples,
        mean=float(samples.mean()),
        std=float(samples.std()),
        p95=float(p95),
        p99=float(p99),
    )
