"""Bounds of numeric options, shared by every command.

Integers get Typer's ``min``/``max`` with these bounds; floats get ``finite(...)`` as
their ``parser``. Either way click refuses a bad value before any work starts (exit 2,
a usage message naming the option) instead of a traceback deep inside numpy or torch:

- ``SEED_MAX``: RNG seeds (``--seed``, ``--first-seed``) are non-negative and fit the
  32-bit words that numpy's ``SeedSequence`` and ``torch.manual_seed`` take everywhere.
- ``COUNT_MAX``: counts (``--seeds``, ``--n``) far above any real run and far below
  what overflows ``range`` or an allocation.
- ``finite``: NaN and ±inf never pass (``--fail-above nan`` could never fire; a NaN
  step or temperature silently poisons every number), and neither does a value
  outside the option's range.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import typer

from cdscope.errors import CdscopeError
from cdscope.settings import COUNT_MAX, SEED_MAX

__all__ = ["COUNT_MAX", "SEED_MAX", "finite"]


def finite(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
) -> Callable[[str], float]:
    """A Typer ``parser``: a finite float in ``[low, high]`` (``(low, high]`` if ``low_open``)."""

    def parse(text: str | float) -> float:
        try:
            value = float(text)
        except ValueError:
            raise typer.BadParameter(f"{text!r} is not a number") from None
        if not math.isfinite(value):
            raise typer.BadParameter(f"{text} is not a finite number")
        below = low is not None and (value < low or (low_open and value == low))
        if below or (high is not None and value > high):
            left = "(" if low_open else "["
            span = f"{left}{'-inf' if low is None else f'{low:g}'}, {'inf' if high is None else f'{high:g}'}]"
            raise typer.BadParameter(f"{value:g} is outside {span}")
        return value

    parse.__name__ = "float"  # what --help shows as the value type
    return parse


def key_values(items: list[str], flag: str, example: str) -> dict[str, Any]:
    """``KEY=VALUE`` strings of a repeatable ``flag`` (``--trl-arg``, ``--vllm-arg``) ->
    dict; values parsed as JSON where they are (true, 0.5, ...), else kept as text."""
    import json

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise CdscopeError(f"{flag} takes KEY=VALUE (like {example}); got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            out[key.strip()] = raw
    return out
