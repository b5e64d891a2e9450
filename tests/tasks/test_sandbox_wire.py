"""The sandbox wire format: exact types survive, anything else is refused, decoding is bounded."""

from __future__ import annotations

import math
import time

import pytest

from cdscope.tasks.sandbox import child as wire

VALUES = [
    None,
    True,
    False,
    0,
    -(10**40),
    1.5,
    -0.0,
    math.inf,
    -math.inf,
    "",
    "é\udc80",
    [],
    [1, [2, [3]]],
    (),
    (1, (2, "a")),
    {"a": 1, 2: [3], (1, 2): {"b": None}},
    set(),
    {1, "a", (2, 3)},
    frozenset({frozenset({1})}),
    [True, 1, 1.0],
]


def _round_trip(value: object) -> object:
    frame = wire.pack({"r": wire.encode(value)})
    body = frame[4:]
    assert wire.frame_length(frame[:4]) == len(body)
    return wire.decode(wire.unpack(body)["r"])


def _same(a: object, b: object) -> bool:
    """Equal with exactly the same types all the way down (1 == 1.0 == True is not enough)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)  # type: ignore[union-attr]
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)  # type: ignore[arg-type]
    return a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [*VALUES, math.nan])
def test_plain_data_round_trips_with_exact_types(value: object) -> None:
    assert _same(_round_trip(value), value)


class AlwaysEqual:
    def __eq__(self, other: object) -> bool:
        return True


class Int(int):
    pass


@pytest.mark.parametrize(
    "value", [AlwaysEqual(), Int(3), [Int(3)], {"k": AlwaysEqual()}, len, b"bytes", 1j, range(3)]
)
def test_anything_else_is_refused(value: object) -> None:
    with pytest.raises(wire.WireError, match="not plain data"):
        wire.encode(value)


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "data",
    [
        {"q": []},
        {"t": 1},
        {"t": [], "s": []},
        {"d": [[1]]},
        {"d": [[[1], 2]]},
        {"s": [[1]]},
        {"s": list(range(wire.MAX_HASHED + 1))},
        _nested(wire.MAX_DEPTH + 1),
    ],
)
def test_malformed_or_oversized_data_is_refused(data: object) -> None:
    with pytest.raises(wire.WireError):
        wire.decode(data)


def test_frames_are_bounded() -> None:
    with pytest.raises(wire.WireError, match="larger than"):
        wire.frame_length((wire.MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(wire.WireError):
        wire.pack({"r": "x" * (wire.MAX_FRAME + 1)})
    with pytest.raises(wire.WireError):
        wire.pack({"r": 10**5000})  # Python's int/str digit limit
    for body in (b"1" * 5000, b"[" * 100_000, b"{not json", "é".encode()):
        with pytest.raises(wire.WireError):
            wire.unpack(body)


def test_hash_collisions_cost_is_bounded() -> None:
    """Ints equal mod 2**61 - 1 share a hash. A set of more than ``MAX_SAME_HASH`` of them
    is refused before any set is built (it failed only past ``MAX_HASHED`` before, and
    4,096 colliding deep tuples then held a verdict for 15 s at a 5 s timeout); the
    largest accepted mix of colliding groups still decodes quickly."""
    colliding = [k * (2**61 - 1) for k in range(1, wire.MAX_HASHED + 1)]
    with pytest.raises(wire.WireError, match="with one hash"):
        wire.decode({"s": colliding})
    deep = [{"t": [{"t": list(range(200))}, k * (2**61 - 1) + 1]} for k in range(1, 18)]
    with pytest.raises(wire.WireError, match="with one hash"):
        wire.decode({"d": [[key, 0] for key in deep]})
    groups = [g + k * (2**61 - 1) for g in range(256) for k in range(1, wire.MAX_SAME_HASH + 1)]
    start = time.perf_counter()
    assert len(wire.decode({"s": groups})) == wire.MAX_HASHED
    assert time.perf_counter() - start < 1.0  # floor ~5 ms measured at 1 and 2 threads


def test_decoding_stops_at_the_deadline() -> None:
    """The deadline covers decoding: a value still being decoded when it passes is a
    ``WireTimeout`` (checked every ``CHECK_EVERY`` nodes), not a late verdict."""
    data = [[1, 2, 3]] * 10_000
    assert wire.decode(data, deadline=time.monotonic() + 60) == [[1, 2, 3]] * 10_000
    with pytest.raises(wire.WireTimeout):
        wire.decode(data, deadline=time.monotonic() - 1)
    assert wire.decode([1] * (wire.CHECK_EVERY - 2), deadline=time.monotonic() - 1)  # no check yet
