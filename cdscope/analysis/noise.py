"""Noise-corrected Gram matrix and the spectral measures read from a Gram (SPEC §3-4).

Why: row m of C is the mean of n per-sample contributions (SPEC §2, l_m held fixed)

    C[m] = (1/n_m) sum_i c_{m,i},      c_{m,i} = (1 / l_m) d log pi_i / d g.

The plain Gram G = C C^T is a biased estimate of the Gram of the *expected* rows: with
independent samples, E[G[m, m']] = <E c_m, E c_m'> for m != m', but the diagonal carries
the per-row sampling variance on top,

    E[G[m, m]] = ||E c_m||^2 + tr Cov(c_m) / n_m,

which inflates tr(G) and pulls B_shared towards 1/M at small n (SPEC §4). The U-statistic
Gram drops the i = j terms from the diagonal:

    G_u[m, m']  = <mean_i c_{m,i}, mean_j c_{m',j}>                      (m != m')
    G_u[m, m]   = 1 / (n_m (n_m - 1)) sum_{i != j} <c_{m,i}, c_{m,j}>
                = (||sum_i c_{m,i}||^2 - sum_i ||c_{m,i}||^2) / (n_m (n_m - 1)),

computed in O(M n K) from the second line, never with a K x K matrix. It needs n_m >= 2.

What is unbiased and what is not: every *entry* of G_u is an unbiased estimate of the
Gram of the expected rows (conditional on the normalisers l_m). The measures are ratios
and eigenvalues of G_u -- B_shared = lambda_1 / tr, R = tr(G^2) / tr(G)^2, B_dir, B_norm
-- and nonlinear functions of an unbiased matrix are not unbiased; their remaining bias
is what ``cdscope nsweep`` and tests/analysis/test_noise_gram.py measure.

Not positive semi-definite: G_u can have negative eigenvalues (a row whose signal is
below its noise can even get a negative diagonal). The measures are then read from the
PSD part G_u+ = V max(Lambda, 0) V^T (the nearest PSD matrix in Frobenius norm), which
keeps every measure inside its SPEC bounds; ``negative_mass`` = sum |lambda_-| / sum
|lambda| reports how much was clipped (0 when G_u is PSD), so a user sees when the
correction is shaky. A measure with a zero denominator after clipping is NaN.

When is the clipped mass large (``CLIPPED_MASS_WARN``)? With a share m of the |eigenvalue|
mass negative, tr(G_u+) = (1 - m) sum |lambda| while tr(G_u) = (1 - 2m) sum |lambda|: the
two defensible readings of a corrected B_shared, lambda_1 over either trace, differ by the
factor (1 - m) / (1 - 2m) -- 5.6 % of the value at m = 0.05, 12.5 % at m = 0.10 (the
embedded model at n = 3). Above 5 % the correction's own ambiguity is larger than the
effects it is used to compare (the paper's paired Delta B_shared is 5.5 points), so the
audits warn there.

Not comparable with the plain measures: B_shared of G_u estimates the share of the
*expected* rows' Gram, the plain B_shared that of the noisy rows at this n (the quantity
the paper reports). They differ by the noise bias by construction, so neither a difference
between them nor one between a corrected value and a published plain value measures
anything; compare corrected with corrected, plain with plain (docs/bshared.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["CLIPPED_MASS_WARN", "gram_measures", "psd_part", "unbiased_gram"]

#: the clipped share of |eigenvalue| mass above which a corrected measure is flagged (doc)
CLIPPED_MASS_WARN = 0.05


def unbiased_gram(samples: Sequence[ArrayLike]) -> np.ndarray:
    """U-statistic Gram of the expected rows from per-sample contributions (module doc).

    ``samples[m]`` has shape [..., n_m, K] (c_{m,i} for i = 1..n_m; leading batch axes
    shared by all families). Returns [..., M, M] in float64. Raises ValueError if some
    n_m < 2 (one sample has no pair i != j: the diagonal is undefined).
    """
    cs = [np.asarray(c, dtype=np.float64) for c in samples]
    if not cs:
        raise ValueError("unbiased_gram needs at least one family")
    for m, c in enumerate(cs):
        if c.ndim < 2:
            raise ValueError(f"family {m}: samples must have shape [..., n, K]; got {c.shape}")
        if c.shape[-2] < 2:
            raise ValueError(
                f"family {m} has n = {c.shape[-2]} sample(s); the unbiased Gram needs n >= 2"
            )
    sums = np.stack([c.sum(axis=-2) for c in cs], axis=-2)  # [..., M, K]
    n = np.array([c.shape[-2] for c in cs], dtype=np.float64)
    means = sums / n[:, None]
    G = np.einsum("...mk,...nk->...mn", means, means)
    squares = np.stack([np.einsum("...ik,...ik->...", c, c) for c in cs], axis=-1)  # [..., M]
    diag = (np.einsum("...mk,...mk->...m", sums, sums) - squares) / (n * (n - 1.0))
    idx = np.arange(len(cs))
    G[..., idx, idx] = diag
    return G


def psd_part(G: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The PSD part of a symmetric G (negative eigenvalues set to 0) and the mass clipped.

    Returns ``(G_plus, negative_mass)``: G_plus = V max(Lambda, 0) V^T and
    negative_mass = sum |negative eigenvalues| / sum |eigenvalues| (0 for a PSD G and
    for G = 0), both batched over leading axes.
    """
    A = np.asarray(G, dtype=np.float64)
    A = 0.5 * (A + np.swapaxes(A, -1, -2))
    w, V = np.linalg.eigh(A)
    total = np.abs(w).sum(axis=-1)
    neg = -np.clip(w, None, 0.0).sum(axis=-1)
    mass = np.divide(neg, total, out=np.zeros_like(neg), where=total > 0)
    return np.einsum("...ij,...j,...kj->...ik", V, np.clip(w, 0.0, None), V), mass


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)


def gram_measures(G: ArrayLike) -> dict[str, np.ndarray]:
    """B_shared, R, B_dir, B_norm (SPEC §3) of the PSD part of a Gram matrix, and the clipped mass.

    With G+ = psd_part(G) and its eigenvalues lambda_1 >= ... >= 0:
    B_shared = lambda_1 / tr(G+); R = ||G+||_F^2 / tr(G+)^2; B_norm = max_m G+[m,m] / tr(G+);
    B_dir = lambda_max(D^-1/2 G+ D^-1/2) / M with D = diag(G+) (the row-cosine matrix).
    For G = C C^T these equal spectral.b_shared / moment_ratio / b_dir / b_norm of C.
    Values are arrays over the leading axes; NaN where a denominator is 0.
    """
    Gp, mass = psd_part(G)
    M = Gp.shape[-1]
    tr = np.einsum("...ii->...", Gp)
    lam = np.linalg.eigvalsh(Gp)
    d = np.einsum("...ii->...i", Gp)
    ok = np.all(d > 0, axis=-1)
    safe = np.where(d > 0, d, 1.0)
    cos = Gp / np.sqrt(safe[..., :, None] * safe[..., None, :])
    b_dir = np.where(ok, np.linalg.eigvalsh(cos)[..., -1] / M, np.nan)
    return {
        "B_shared": _ratio(lam[..., -1], tr),
        "R": _ratio(np.einsum("...ij,...ij->...", Gp, Gp), tr**2),
        "B_dir": b_dir,
        "B_norm": _ratio(d.max(axis=-1), tr),
        "negative_mass": mass,
    }
