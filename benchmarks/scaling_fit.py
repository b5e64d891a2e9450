"""Pure fits behind ``benchmarks/scaling.py`` (issue 16): no torch, no model.

- ``fit_power_law``: cost = k * prod_j x_j^a_j, least squares on
  log cost = log k + sum_j a_j log x_j (ordinary least squares in log space).
- ``fit_linear``: y = b0 + sum_j b_j x_j, ordinary least squares (the memory law:
  peak bytes = fixed bytes + bytes per token * tokens, or activation bytes per token as
  a combination of architecture sizes).

Both return the coefficients and the root-mean-square residual, so a caller can tell a
law that describes its data from one that does not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PowerLaw:
    """cost = coefficient * prod_j x_j ** exponents[j]; ``rms_log`` the RMS residual of log cost."""

    coefficient: float
    exponents: tuple[float, ...]
    rms_log: float

    def predict(self, *xs: float | np.ndarray) -> np.ndarray:
        """The fitted cost at ``xs`` (one value or array per variable, in fit order)."""
        out = np.full(np.broadcast(*xs).shape, self.coefficient, dtype=float)
        for x, a in zip(xs, self.exponents, strict=True):
            out = out * np.asarray(x, dtype=float) ** a
        return out


@dataclass(frozen=True)
class LinearLaw:
    """y = intercept + sum_j slopes[j] * x_j; ``rms`` the RMS residual in y's units."""

    intercept: float
    slopes: tuple[float, ...]
    rms: float

    def predict(self, *xs: float | np.ndarray) -> np.ndarray:
        out = np.full(np.broadcast(*xs).shape, self.intercept, dtype=float)
        for x, b in zip(xs, self.slopes, strict=True):
            out = out + b * np.asarray(x, dtype=float)
        return out


def _design(xs: tuple[np.ndarray, ...], n: int, intercept: bool) -> np.ndarray:
    columns = [np.ones(n)] if intercept else []
    columns += [np.asarray(x, dtype=float).reshape(-1) for x in xs]
    design = np.stack(columns, axis=1)
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise ValueError(
            "the fit is underdetermined: the variables do not vary independently in the data"
        )
    return design


def fit_power_law(y: np.ndarray, *xs: np.ndarray) -> PowerLaw:
    """Least squares of log y = log k + sum_j a_j log x_j over the data points.

    Each ``x_j`` must vary (in log space) independently of the others, otherwise its
    exponent is not identified and ``ValueError`` is raised; every value must be > 0.
    """
    y = np.asarray(y, dtype=float).reshape(-1)
    if np.any(y <= 0) or any(np.any(np.asarray(x) <= 0) for x in xs):
        raise ValueError("a power law is fitted in log space: every value must be positive")
    design = _design(tuple(np.log(np.asarray(x, dtype=float)) for x in xs), len(y), True)
    coef, *_ = np.linalg.lstsq(design, np.log(y), rcond=None)
    residual = np.log(y) - design @ coef
    return PowerLaw(float(np.exp(coef[0])), tuple(float(a) for a in coef[1:]),
                    float(np.sqrt(np.mean(residual**2))))  # fmt: skip


def fit_linear(y: np.ndarray, *xs: np.ndarray, intercept: bool = True) -> LinearLaw:
    """Ordinary least squares of y = b0 + sum_j b_j x_j (``intercept=False``: b0 = 0)."""
    y = np.asarray(y, dtype=float).reshape(-1)
    design = _design(xs, len(y), intercept)
    coef, *_ = np.linalg.lstsq(design, y, rcond=None)
    residual = y - design @ coef
    slopes = coef[1:] if intercept else coef
    return LinearLaw(float(coef[0]) if intercept else 0.0, tuple(float(b) for b in slopes),
                     float(np.sqrt(np.mean(residual**2))))  # fmt: skip
