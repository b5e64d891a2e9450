"""What every generation engine takes and returns (``cdscope.core.engines``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class GenRequest:
    """``n`` completions of ``prompt`` (raw text, no chat template), each at most
    ``max_tokens`` tokens, drawn under ``seed`` (the problem's own seed)."""

    prompt: str
    n: int
    max_tokens: int
    seed: int


@dataclass
class Generation:
    """The completions of one request, in sample order. ``tokens[i]``: tokens generated
    for completion i (its end-of-sequence token included), None where the engine does not
    say (a server answering several choices without per-choice counts); ``total_tokens``:
    all tokens generated for the request (the server's ``usage`` for an endpoint)."""

    texts: list[str]
    tokens: list[int | None]
    total_tokens: int = field(default=-1)

    def __post_init__(self) -> None:
        if self.total_tokens < 0:
            self.total_tokens = sum(t for t in self.tokens if t is not None)


class Engine(Protocol):
    """``generate`` answers every request; ``per_call``: how many requests one call
    should carry (the caller's progress and progress-file unit); ``describe``: what the
    run metadata records about the engine."""

    per_call: int

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]: ...

    def describe(self) -> dict: ...

    def close(self) -> None: ...


def part_seed(seed: int, part: int) -> int:
    """The seed of the ``part``-th request for one problem's samples (part 0: the
    problem's own seed): where an engine splits n over several requests."""
    if part == 0:
        return seed
    return int(np.random.SeedSequence([seed, part]).generate_state(1, dtype=np.uint64)[0] >> 1)
