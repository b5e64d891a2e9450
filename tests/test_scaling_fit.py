"""The fits behind benchmarks/scaling.py recover known laws from synthetic data."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling_fit.py"
_spec = importlib.util.spec_from_file_location("scaling_fit", _PATH)
assert _spec is not None and _spec.loader is not None
scaling_fit = importlib.util.module_from_spec(_spec)
sys.modules["scaling_fit"] = scaling_fit  # dataclasses resolve annotations through it
_spec.loader.exec_module(scaling_fit)


def _grid() -> tuple[np.ndarray, np.ndarray]:
    params = np.array([1.35e8, 3.6e8, 1.5e9, 1.7e9, 1.35e8, 1.35e8, 1.35e8])
    tokens = np.array([96, 96, 96, 96, 192, 384, 576], dtype=float)
    return params, tokens


def test_power_law_recovers_exponents_exactly_without_noise() -> None:
    params, tokens = _grid()
    cost = 3e-9 * params**0.93 * tokens**1.1
    law = scaling_fit.fit_power_law(cost, params, tokens)
    assert law.exponents == pytest.approx((0.93, 1.1), abs=1e-9)
    assert law.coefficient == pytest.approx(3e-9, rel=1e-6)
    assert law.rms_log < 1e-9
    assert law.predict(7.6e9, 2700.0) == pytest.approx(3e-9 * 7.6e9**0.93 * 2700**1.1, rel=1e-6)


def test_power_law_under_noise_is_close_and_reports_the_residual() -> None:
    rng = np.random.default_rng(0)
    params = np.geomspace(1e8, 2e9, 12).repeat(3)
    tokens = np.tile([100.0, 300.0, 900.0], 12)
    cost = 2.0 * params**0.8 * tokens**1.3 * np.exp(rng.normal(0, 0.05, params.size))
    law = scaling_fit.fit_power_law(cost, params, tokens)
    assert law.exponents[0] == pytest.approx(0.8, abs=0.05)
    assert law.exponents[1] == pytest.approx(1.3, abs=0.05)
    assert 0.02 < law.rms_log < 0.08


def test_power_law_refuses_a_variable_that_does_not_vary_independently() -> None:
    params = np.array([1e8, 2e8, 4e8])
    with pytest.raises(ValueError, match="underdetermined"):
        scaling_fit.fit_power_law(params * 2, params, params * 10)  # tokens ∝ params
    with pytest.raises(ValueError, match="positive"):
        scaling_fit.fit_power_law(np.array([1.0, -1.0, 2.0]), params)


def test_linear_law_recovers_intercept_and_slopes() -> None:
    tokens = np.array([96.0, 192.0, 384.0, 576.0])
    law = scaling_fit.fit_linear(5e8 + 2.5e5 * tokens, tokens)
    assert law.intercept == pytest.approx(5e8)
    assert law.slopes == pytest.approx((2.5e5,))
    L = np.array([30.0, 32.0, 28.0, 24.0])  # noqa: N806
    h = np.array([576.0, 960.0, 1536.0, 2048.0])
    i = np.array([1536.0, 2560.0, 8960.0, 8192.0])
    V = np.array([49152.0, 49152.0, 151936.0, 49152.0])  # noqa: N806
    arch = scaling_fit.fit_linear(40 * L * h + 12 * L * i + 8 * V, L * h, L * i, V, intercept=False)
    assert arch.intercept == 0.0
    assert arch.slopes == pytest.approx((40, 12, 8), rel=1e-9)
    assert arch.predict(28 * 3584, 28 * 18944, 152064) == pytest.approx(
        40 * 28 * 3584 + 12 * 28 * 18944 + 8 * 152064
    )
