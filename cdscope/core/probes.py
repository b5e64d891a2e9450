"""Probe pools and seeded probe draws (SPEC §2, §4).

A pool file is JSONL, one object per line with at least ``id``, ``family``, ``prompt``
and ``target`` (strings); ``source`` is recommended, other keys are kept as extras.
The shipped pools are package data in ``cdscope/data/probes/`` (``$CDSCOPE_PROBES``
overrides the folder; ``probes/build_pools.py`` in the repository builds them); users
pass their own files with ``--probe``.

A probe seed ``s`` draws ``n`` items per family without replacement, deterministically
from ``s`` and the family name alone (items are ordered by id first), so the same seed
gives the same probe for every model — the pairing that model comparisons rely on.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cdscope.errors import CdscopeError, option
from cdscope.io import json_record, jsonl_lines, require_keys
from cdscope.resources import default_probe_dir

REQUIRED_KEYS = ("id", "family", "prompt", "target")


@dataclass(frozen=True)
class ProbeItem:
    """One probe sample: (family m, prompt x, verified-correct target y*)."""

    id: str
    family: str
    prompt: str
    target: str
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class ProbePool:
    """All items by family (families sorted by name, items sorted by id)."""

    by_family: dict[str, tuple[ProbeItem, ...]]
    paths: tuple[str, ...]

    @property
    def families(self) -> list[str]:
        return list(self.by_family)

    @property
    def hash(self) -> str:
        """Content hash of the pool (ids, families, prompts, targets): equal pools, equal hash."""
        digest = hashlib.sha256()
        for family in self.families:
            for item in self.by_family[family]:
                record = [item.id, item.family, item.prompt, item.target]
                digest.update(json.dumps(record, ensure_ascii=False).encode())
        return "sha256:" + digest.hexdigest()[:16]


def default_pool_paths() -> list[Path]:
    directory = default_probe_dir()
    paths = sorted(directory.glob("*.jsonl"))
    if not paths:
        raise CdscopeError(
            f"no shipped probe pools found in {directory}; pass {option('probe', 'FILE.jsonl')} "
            "or set CDSCOPE_PROBES to a folder of pool files"
        )
    return paths


def parse_record(record: object, where: str) -> ProbeItem:
    """One pool object (a JSONL line's or a caller's dict) -> a ProbeItem, or a one-line
    CdscopeError starting with ``where``."""
    need = f"a probe item needs {', '.join(REQUIRED_KEYS)}; 'target' is the verified-correct answer"
    record = require_keys(record, where, REQUIRED_KEYS, need)
    for key in REQUIRED_KEYS:
        if not isinstance(record[key], str) or not record[key]:
            raise CdscopeError(f"{where}: {key!r} must be a non-empty string")
    extra = {k: v for k, v in record.items() if k not in (*REQUIRED_KEYS, "source")}
    return ProbeItem(
        record["id"],
        record["family"],
        record["prompt"],
        record["target"],
        str(record.get("source", "")),
        extra,
    )


def load_pool(paths: Sequence[str | Path] | None = None) -> ProbePool:
    """Read and validate pool files (default: the shipped pools). Errors name file:line."""
    resolved = [Path(p) for p in paths] if paths else default_pool_paths()
    parsed: list[tuple[ProbeItem, str]] = []
    for path in resolved:
        empty = "no items (an empty family cannot be probed)"
        for line, where in jsonl_lines(path, "probe", empty):
            parsed.append((parse_record(json_record(line, where, ()), where), where))
    return _pool(parsed, tuple(str(p) for p in resolved))


def pool_from_records(records: Sequence[object], name: str = "records") -> ProbePool:
    """A pool from in-memory dicts (same keys and checks as a pool file's lines).

    Errors name the record: ``records[3]: missing key(s) target ...``.
    """
    if len(records) == 0:
        raise CdscopeError(f"{name}: no probe items (an empty pool cannot be probed)")
    parsed = [(parse_record(r, f"{name}[{i}]"), f"{name}[{i}]") for i, r in enumerate(records)]
    return _pool(parsed, (f"<{name}>",))


def _pool(parsed: list[tuple[ProbeItem, str]], paths: tuple[str, ...]) -> ProbePool:
    """Group checked items by family (sorted), refusing duplicate ids."""
    items: dict[str, ProbeItem] = {}
    first_seen: dict[str, str] = {}
    for item, where in parsed:
        if item.id in items:
            raise CdscopeError(
                f"{where}: duplicate id {item.id!r} (first at {first_seen[item.id]})"
            )
        items[item.id] = item
        first_seen[item.id] = where
    by_family: dict[str, list[ProbeItem]] = {}
    for item in items.values():
        by_family.setdefault(item.family, []).append(item)
    ordered = {
        family: tuple(sorted(by_family[family], key=lambda it: it.id))
        for family in sorted(by_family)
    }
    return ProbePool(ordered, paths)


def _family_rng(seed: int, family: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(family.encode())])


def draw_probe(
    pool: ProbePool, seed: int, n: int, families: Sequence[str] | None = None
) -> list[ProbeItem]:
    """``n`` items per family without replacement, from ``seed`` and the family name alone.

    Returns the items grouped by family in ``pool.families`` order (or ``families``).
    """
    if n < 1:
        raise CdscopeError(f"{option('n')} must be at least 1, got {n}")
    chosen = list(families) if families else pool.families
    drawn: list[ProbeItem] = []
    for family in chosen:
        items = pool.by_family.get(family, ())
        if not items:
            raise CdscopeError(
                f"family {family!r} has no items in the probe pool ({', '.join(pool.families)})"
            )
        if len(items) < n:
            raise CdscopeError(
                f"family {family!r} has {len(items)} probe item(s), fewer than "
                f"{option('n', n)}; lower {option('n')} or add items to the pool"
            )
        picks = _family_rng(seed, family).choice(len(items), size=n, replace=False)
        drawn.extend(items[i] for i in sorted(picks))
    return drawn


def drawn_ids(items: Sequence[ProbeItem]) -> dict[str, list[str]]:
    """``{family: [item ids]}`` of a draw, for output metadata: which items a seed used."""
    out: dict[str, list[str]] = {}
    for item in items:
        out.setdefault(item.family, []).append(item.id)
    return out
