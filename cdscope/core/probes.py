"""Probe pools and seeded probe draws (SPEC §2, §4).

A pool file is JSONL, one object per line with at least ``id``, ``family``, ``prompt``
and ``target`` (strings); ``source`` is recommended, other keys are kept as extras.
The shipped pools are package data in ``cdscope/data/probes/`` (``$CDSCOPE_PROBES``
overrides the folder; ``probes/build_pools.py`` in the repository builds them); users
pass their own files with ``--probe``.

A probe seed ``s`` draws ``n`` items per family without replacement, deterministically
from ``s`` and the family name alone (items are ordered by id first), so the same seed
gives the same probe for every model — the pairing that model comparisons rely on.

**Train / audit split** (``split_pool``, docs/probes.md). Every pool has two fixed halves,
decided by item id alone: within a family the items are ordered by (stratum, SHA-256 of
``SPLIT_SALT + id``) -- the stratum is the id without its last ``/`` part
(``math/gsm_symbolic/3`` -> ``math/gsm_symbolic``), so every generator is split too -- and
alternate between ``train`` (even places) and ``audit`` (odd places). Training draws its
probe from the train half and audits a run on the audit half, so the two never share an
item; the shipped pools split 32 / 32 per family (8 / 8 per generator). A trained model's
folder records its training probe's item ids (``TRAINING_PROBE_FILE``), so an audit can
tell when it measures a model on items it was regularised on.
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
from cdscope.io import atomic_write_bytes, json_record, jsonl_lines, require_keys
from cdscope.resources import default_probe_dir
from cdscope.settings.names import PROBE_SPLITS

#: the salt of the split's hash: changing it would move items between the halves
SPLIT_SALT = "cdscope-probe-split/"
#: in a trained model's folder: the item ids of the probe it was trained on (JSON)
TRAINING_PROBE_FILE = "cdscope_training_probe.json"

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
    split: str = "all"  # the half of the pool files these items are (``split_pool``)

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


def split_of(items: Sequence[ProbeItem]) -> dict[str, str]:
    """``{item id: "train" | "audit"}`` for one family's ``items`` (see the module
    docstring): ordered by (stratum, SHA-256 of salt + id), alternating train, audit."""

    def key(item: ProbeItem) -> tuple[str, str]:
        stratum = item.id.rpartition("/")[0]
        return stratum, hashlib.sha256((SPLIT_SALT + item.id).encode()).hexdigest()

    ordered = sorted(items, key=key)
    return {item.id: ("train", "audit")[i % 2] for i, item in enumerate(ordered)}


def split_pool(pool: ProbePool, split: str) -> ProbePool:
    """The ``split`` half of ``pool`` (``train`` | ``audit``), or ``pool`` itself (``all``).

    One-line error for an unknown split, or for a family whose half is empty (a pool of
    one item per family has no audit half)."""
    if split not in PROBE_SPLITS:
        raise CdscopeError(
            f"--probe-split must be one of {' | '.join(PROBE_SPLITS)}; got {split!r}"
        )
    if split == "all" or pool.split == split:
        return pool
    if pool.split != "all":
        raise CdscopeError(f"the {pool.split} half of a probe pool has no {split} half")
    halves: dict[str, tuple[ProbeItem, ...]] = {}
    for family, items in pool.by_family.items():
        side = split_of(items)
        halves[family] = tuple(item for item in items if side[item.id] == split)
        if not halves[family]:
            raise CdscopeError(
                f"family {family!r} has {len(items)} probe item(s), none in the {split} half of "
                f"the pool (docs/probes.md); add items or use --probe-split all"
            )
    return ProbePool(halves, pool.paths, split)


def item_overlap(drawn: Sequence[str], trained: Sequence[str]) -> list[str]:
    """The ids of ``drawn`` that are also in ``trained``, sorted."""
    return sorted(set(drawn) & set(trained))


def write_training_probe(folder: Path, record: dict) -> None:
    """Record a trained model's training probe in its folder (``TRAINING_PROBE_FILE``):
    ``record`` holds at least ``training_probe_items`` (a list of item ids)."""
    text = json.dumps(record, sort_keys=True)
    atomic_write_bytes(Path(folder) / TRAINING_PROBE_FILE, lambda tmp: Path(tmp).write_text(text))


def read_training_probe(folder: str | Path) -> dict | None:
    """The training-probe record of a model folder (``training_probe_items``, the
    regulariser, ...), or None (no such folder or file: not a model cdscope trained). A
    file cdscope cannot read is treated as absent: the record only feeds a warning."""
    path = Path(folder) / TRAINING_PROBE_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        items = record["training_probe_items"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(items, list):
        return None
    return {**record, "training_probe_items": [str(i) for i in items]}


def drawn_ids(items: Sequence[ProbeItem]) -> dict[str, list[str]]:
    """``{family: [item ids]}`` of a draw, for output metadata: which items a seed used."""
    out: dict[str, list[str]] = {}
    for item in items:
        out.setdefault(item.family, []).append(item.id)
    return out
