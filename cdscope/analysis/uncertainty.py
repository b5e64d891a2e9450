"""Per-sample uncertainty of the audit measures within one probe seed (SPEC §4).

Built on the per-sample probe quantities (``FamilySamples``, read from the long frame by
``frames.sample_sets``): for family m with
samples i = 1..n_m, log pi_i, d log pi_i / d g and F_i.

* ``corrected_measures``: B_shared, R, B_dir, B_norm of the noise-corrected Gram
  (``noise.unbiased_gram`` of c_{m,i} = (1 / l_m) d log pi_i / d g, l_m held fixed) and the
  eigenvalue mass clipped to make it PSD, named ``<measure>_C_unbiased`` and
  ``gram_negative_mass``.
* ``bootstrap_intervals``: within a seed, resample each family's samples with replacement
  (whole samples: log pi_i, d log pi_i / d g and F_i together), recompute l_m, C, F and
  every measure on each of B resamples, and report the percentile interval (given the
  full-sample values: centred on them, ``stats.bootstrap_interval``). l_m is
  recomputed per resample, so the interval includes the normaliser's noise. Bootstrap
  intervals at n = 2..3 are crude (a resample of 3 samples has at most 3 distinct values
  per family); they are a floor on the within-seed uncertainty, not a calibrated 95 %.
* ``direction_stability``: does the leading eigenvector of the Gram stay put across
  seeds? Davis-Kahan view: per seed, the angle between the leading eigenvector of its
  trace-normalised Gram Ĝ_s and that of the seeds' mean Ḡ, the eigengap
  (lambda_1 - lambda_2) of Ĝ_s, and the Davis-Kahan bound on that angle,
  sin theta <= 2 ||Ĝ_s - Ḡ||_op / (lambda_1(Ḡ) - lambda_2(Ḡ)) (Yu, Wang & Samworth 2015).
  The same angle is reported for the gate-space direction (top right singular vector).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from cdscope.analysis.noise import gram_measures, unbiased_gram
from cdscope.analysis.stats import bootstrap_interval

#: a measure's name, (name, family) for a measure of one family, or (name, family,
#: family_b) for one of a pair (the audit tables' tidy columns)
MeasureKey = str | tuple[str, ...]
#: (families, C, F) -> {key: value}; the audit engine's measure functions
MeasureFn = Callable[[list[str], np.ndarray, np.ndarray], dict[MeasureKey, float]]

CORRECTED = {
    "B_shared": "B_shared_C_unbiased",
    "R": "R_C_unbiased",
    "B_dir": "B_dir_unbiased",
    "B_norm": "B_norm_unbiased",
    "negative_mass": "gram_negative_mass",
}


@dataclass(frozen=True)
class FamilySamples:
    """One family's per-sample probe quantities (SPEC §2): the family means are
    l_m = mean(logp), dl_m/dg = mean(dlogp, axis=0), F_m = mean(F, axis=0)."""

    logp: np.ndarray  # [n]
    dlogp: np.ndarray  # [n, K]
    F: np.ndarray  # [n, K]


def contributions(sets: Sequence[FamilySamples]) -> list[np.ndarray]:
    """c_{m,i} = d log pi_i / d g / l_m with l_m = mean_i log pi_i held fixed: [n_m, K] each."""
    return [s.dlogp / s.logp.mean() for s in sets]


def corrected_measures(
    sets: Sequence[FamilySamples], names: Sequence[str] | None = None
) -> dict[str, float]:
    """The noise-corrected measures of one (model, seed), ``names`` from CORRECTED's values;
    a corrected measure always comes with the eigenvalue mass clipped to read it
    (``gram_negative_mass``: how far to trust it, noise.CLIPPED_MASS_WARN).

    Empty when some family has fewer than 2 samples (the unbiased Gram is undefined).
    """
    if min(len(s.logp) for s in sets) < 2:
        return {}
    values = gram_measures(unbiased_gram(contributions(sets)))
    out = {CORRECTED[k]: float(v) for k, v in values.items()}
    wanted = None if names is None else {*names, *([CORRECTED["negative_mass"]] if names else [])}
    return {k: v for k, v in out.items() if wanted is None or k in wanted}


#: float64 elements of one chunk of bootstrap resamples (C, F and c_{m,i}: ~128 MiB)
_CHUNK_ELEMENTS = 1 << 24


def _resampled(
    sets: Sequence[FamilySamples], draws: Sequence[np.ndarray]
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Resamples ``draws[m]`` ([b, n_m] sample indices per family): C [b, M, K],
    F [b, M, K], and c_{m,i} per family [b, n_m, K]."""
    Cs, Fs, cs = [], [], []
    for s, idx in zip(sets, draws, strict=True):
        ell = s.logp[idx].mean(axis=1)  # [b]
        c = s.dlogp[idx] / ell[:, None, None]  # [b, n, K]
        cs.append(c)
        Cs.append(c.mean(axis=1))
        Fs.append(s.F[idx].mean(axis=1))
    return np.stack(Cs, axis=1), np.stack(Fs, axis=1), cs


def bootstrap_intervals(
    families: list[str],
    sets: Sequence[FamilySamples],
    measures: MeasureFn,
    corrected: Sequence[str],
    B: int = 1000,
    seed: int = 0,
    level: float = 0.95,
    estimates: dict[MeasureKey, float] | None = None,
) -> dict[MeasureKey, tuple[float, float]]:
    """Bootstrap interval of every measure over resampled probe samples (module doc).

    Returns {measure: (low, high)} for ``measures``' outputs and the ``corrected`` names:
    the percentile interval, or with ``estimates`` (each measure's full-sample value) the
    percentile interval centred on that value (``stats.bootstrap_interval``), which
    always contains it — at n = 3 per family the resampled values of B_shared can lie
    almost all on one side of the estimate, and the percentile interval then misses it.
    A resample on which a measure is undefined (e.g. an all-zero row) counts as NaN and
    is left out of that measure's quantiles; an interval with no finite value is NaN.
    The resamples are drawn first (family by family) and then evaluated in chunks whose
    C, F and c_{m,i} stay within ``_CHUNK_ELEMENTS`` (large K: gates per head or neuron).
    """
    rng = np.random.default_rng(seed)
    indices = [rng.integers(0, len(s.logp), size=(B, len(s.logp))) for s in sets]
    K = sets[0].dlogp.shape[1]  # noqa: N806
    chunk = max(1, _CHUNK_ELEMENTS // (K * sum(len(s.logp) + 2 for s in sets)))
    draws: dict[MeasureKey, list[float]] = {}
    for first in range(0, B, chunk):
        C, F, cs = _resampled(sets, [idx[first : first + chunk] for idx in indices])
        for b in range(C.shape[0]):
            try:
                values = measures(families, C[b], F[b])
            except ValueError:
                continue
            for name, value in values.items():
                draws.setdefault(name, []).append(value)
        if corrected and min(len(s.logp) for s in sets) >= 2:
            for key, arr in gram_measures(unbiased_gram(cs)).items():
                if CORRECTED[key] in corrected:
                    draws.setdefault(CORRECTED[key], []).extend(arr)
    method = "percentile" if estimates is None else "centred"
    return {
        name: bootstrap_interval(values, (estimates or {}).get(name, np.nan), level, method)
        for name, values in draws.items()
    }


def _leading(G: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (descending) and leading eigenvector of a symmetric matrix."""
    w, V = np.linalg.eigh(G)
    return w[::-1], V[:, -1]


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    cos = abs(float(a @ b)) / (np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.degrees(np.arccos(min(1.0, cos))))


def _gate_direction(Z: np.ndarray) -> np.ndarray:
    """Leading eigenvector of the K x K matrix Z^T Z without forming it: Z^T u / ||Z^T u||
    with u the leading eigenvector of the small Gram Z Z^T (rows x rows). The seeds' mean
    of C_s^T C_s / tr_s is Z^T Z for Z the stacked C_s / sqrt(tr_s) (scale is irrelevant)."""
    v = Z.T @ _leading(Z @ Z.T)[1]
    return v / np.linalg.norm(v)


def direction_stability(matrices: dict[int, np.ndarray]) -> pd.DataFrame:
    """Per seed: angles of the leading family- and gate-space directions to the seeds'
    mean, the eigengap and the Davis-Kahan bound (module doc). ``matrices``: seed -> C.

    Columns: seed, angle_deg, dk_bound_deg, eigengap, gate_angle_deg. The eigengap is of
    the trace-normalised Gram, so it reads in B_shared units (lambda_1 - lambda_2) / tr.
    """
    seeds = sorted(matrices)
    grams = [matrices[s] @ matrices[s].T for s in seeds]
    grams = [G / np.trace(G) for G in grams]
    w_mean, u_mean = _leading(np.mean(grams, axis=0))
    v_mean = _gate_direction(
        np.concatenate([matrices[s] / np.sqrt(np.sum(matrices[s] ** 2)) for s in seeds])
    )
    gap_mean = w_mean[0] - w_mean[1] if len(w_mean) > 1 else np.inf
    rows = []
    for seed, G in zip(seeds, grams, strict=True):
        w, u = _leading(G)
        v = _gate_direction(matrices[seed])
        spread = float(np.linalg.norm(G - np.mean(grams, axis=0), ord=2))
        sin_bound = min(1.0, 2.0 * spread / gap_mean) if gap_mean > 0 else 1.0
        rows.append(
            {
                "seed": seed,
                "angle_deg": _angle_deg(u, u_mean),
                "dk_bound_deg": float(np.degrees(np.arcsin(sin_bound))),
                "eigengap": float(w[0] - w[1]) if len(w) > 1 else float("nan"),
                "gate_angle_deg": _angle_deg(v, v_mean),
            }
        )
    return pd.DataFrame(rows)
