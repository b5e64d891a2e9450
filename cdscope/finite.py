"""Refusing non-finite measurements with one line that names the first bad quantity.

A NaN or inf anywhere in a measurement (l_m, dl_m/dg, C, F, an edge score, a logit)
means the model's weights are non-finite or overflow in the chosen dtype; no number
computed from it means anything, so cdscope stops with exit 2 instead of writing NaN
rows or garbage. ``require_finite`` walks ``(name, values)`` pairs in order and raises
``NonFinite`` for the first entry that is not finite, e.g.

    l_m of family 'code' is NaN at seed 0 of model 'ckpt': the model's weights are
    non-finite or overflow in its dtype (check the weights; try --dtype float32)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from cdscope.errors import CdscopeError

HINT = (
    "the model's weights are non-finite or overflow in its dtype "
    "(check the weights; try --dtype float32)"
)


class NonFinite(CdscopeError):
    """A measured quantity is NaN or ±inf; ``at`` adds where (seed, model) it happened."""

    def __init__(self, quantity: str, kind: str, where: str = "", hint: str = HINT) -> None:
        self.quantity, self.kind, self.where, self.hint = quantity, kind, where, hint
        place = f" {where}" if where else ""
        super().__init__(f"{quantity} is {kind}{place}: {hint}")

    def at(self, where: str) -> NonFinite:
        """The same refusal with ``where`` (e.g. "at seed 0 of model 'x'") appended."""
        joined = f"{self.where} {where}".strip()
        return NonFinite(self.quantity, self.kind, joined, self.hint)


def _as_array(values: Any) -> np.ndarray:
    if hasattr(values, "detach"):  # a torch tensor, on any device and in any dtype
        values = values.detach().float().cpu().numpy()
    return np.asarray(values, dtype=np.float64)


def _kind(value: float) -> str:
    return "NaN" if np.isnan(value) else ("+inf" if value > 0 else "-inf")


def first_non_finite(named: Iterable[tuple[str, Any]]) -> tuple[str, str] | None:
    """``(label, 'NaN' | '+inf' | '-inf')`` of the first non-finite entry, or None.

    The label is the pair's name, with the entry's index for arrays (``C of family
    'math' at [3]``).
    """
    for name, values in named:
        array = _as_array(values)
        bad = ~np.isfinite(array)
        if bad.any():
            flat = int(np.flatnonzero(bad)[0])
            label = name
            if array.ndim:
                index = np.unravel_index(flat, array.shape)
                label += f" at [{', '.join(str(int(i)) for i in index)}]"
            return label, _kind(float(array.flat[flat]))
    return None


def require_finite(named: Iterable[tuple[str, Any]], where: str = "", hint: str = HINT) -> None:
    """Raise ``NonFinite`` naming the first non-finite entry of ``named`` (in order)."""
    found = first_non_finite(named)
    if found is not None:
        raise NonFinite(found[0], found[1], where, hint)


#: finite but absurd: a value this large in a file (C, F, l_m, per-sample entries) cannot
#: come from a measurement, and its square would overflow float64 in a Gram over up to
#: COUNT_MAX gates; such values are refused by name like NaN
ABSURD = 1e100


def first_unusable(values: Any, rows: Any = None) -> tuple[int, str] | None:
    """``(index, 'NaN' | '+inf' | '-inf' | 'absurdly large (|x| > 1e100)')`` of the first
    entry of the 1-D float array ``values`` (among ``rows``, a boolean mask, if given)
    that is not finite or whose magnitude exceeds ``ABSURD``; None when all are usable."""
    array = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(array) | (np.abs(array) > ABSURD)
    if rows is not None:
        bad &= np.asarray(rows, dtype=bool)
    if not bad.any():
        return None
    index = int(np.flatnonzero(bad)[0])
    value = float(array[index])
    return index, _kind(value) if not np.isfinite(value) else f"absurdly large (|x| > {ABSURD:g})"
