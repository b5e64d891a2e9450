"""Verifiable tasks for training and evaluation: the JSONL format (SPEC §5, §7).

A task file is JSONL, one object per line::

    {"id": "math/gsm_symbolic/train/17", "family": "math",
     "prompt": "...\\nSolution:\\n", "verifier": "math", "answer": "42",
     "source": "reasoning_gym:gsm_symbolic:seed=2000:idx=17", "meta": {...}}

Required keys: ``id``, ``family``, ``prompt``, ``verifier`` (non-empty strings). The
verifier kind names an entry of ``cdscope.tasks.judging.verifiers.VERIFIERS`` and fixes which
other keys must be present: ``code`` kinds need ``tests`` (a program defining
``check(candidate)``) and ``entry_point``; every other kind needs ``answer``. Optional:
``source`` (string) and ``meta`` (object). Any other key is an error, so a typo is not
silently ignored. Errors name ``file:line``.

The shipped sets are package data in ``cdscope/data/tasks/<split>/{math,code,logic}.jsonl``
(``$CDSCOPE_TASKS`` overrides the folder); ``tasks/build_tasks.py`` in the repository
builds them from the slices of the sources held out of the probe pools (docs/tasks.md).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from cdscope.errors import CdscopeError
from cdscope.io import atomic_write_bytes, json_record, require_keys
from cdscope.resources import default_task_dir
from cdscope.tasks.io.readers import (
    is_native,
    parse_mapping,
    read_rows,
    row_to_task,
    schema_fields,
    split_source,
)
from cdscope.tasks.judging import verifier_kinds
from cdscope.tasks.record import (
    OPTIONAL_KEYS,
    REQUIRED_KEYS,
    Task,
    is_code_kind,
    required_fields,
)

FAMILIES = ("math", "code", "logic")
SPLITS = ("train", "eval")


def check_task(task: Task, where: str = "task") -> Task:
    """Raise CdscopeError (prefixed with ``where``) when ``task`` cannot be verified."""
    for key in REQUIRED_KEYS:
        value = getattr(task, key)
        if not isinstance(value, str) or not value:
            raise CdscopeError(f"{where}: {key!r} must be a non-empty string")
    kinds = verifier_kinds()
    if task.verifier not in kinds:
        raise CdscopeError(
            f"{where}: unknown verifier kind {task.verifier!r} (known: {', '.join(kinds)})"
        )
    for key in required_fields(task.verifier):
        value = getattr(task, key)
        if not isinstance(value, str) or not value.strip():
            raise CdscopeError(
                f"{where}: verifier {task.verifier!r} needs a non-empty string {key!r}"
            )
    for key in ("source",):
        value = getattr(task, key)
        if value is not None and not isinstance(value, str):
            raise CdscopeError(f"{where}: {key!r} must be a string")
    if not isinstance(task.meta, dict):
        raise CdscopeError(f"{where}: 'meta' must be a JSON object")
    return task


def parse_task(line: str, where: str) -> Task:
    """One JSONL line -> a checked Task; errors start with ``where`` (``file:line``)."""
    return task_from_record(json_record(line, where, REQUIRED_KEYS), where)


def task_from_record(record: object, where: str) -> Task:
    """A task record (a JSON object in cdscope's format) -> a checked Task."""
    record = require_keys(record, where, REQUIRED_KEYS)
    unknown = sorted(set(record) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise CdscopeError(
            f"{where}: unknown key(s) {', '.join(unknown)} "
            f"(allowed: {', '.join((*REQUIRED_KEYS, *OPTIONAL_KEYS))}; put extras under 'meta')"
        )
    for key in ("answer", "tests", "entry_point"):
        if key in record and record[key] is not None and not isinstance(record[key], str):
            raise CdscopeError(f"{where}: {key!r} must be a string")
    task = Task(**{k: record[k] for k in (*REQUIRED_KEYS, *OPTIONAL_KEYS) if k in record})
    return check_task(task, where)


def _source_tasks(raw: str | Path, columns: str | None) -> list[tuple[Task, str]]:
    """The tasks of one source (``readers``: a file or folder, with an optional mapping)."""
    path, own = split_source(raw)  # a PATH?MAPPING source's own mapping always applies;
    shared = parse_mapping(columns) if columns else {}  # --task-columns: not to cdscope rows
    found, fields = [], None
    for index, (row, where) in enumerate(read_rows(path)):
        if not isinstance(row, dict):
            raise CdscopeError(f"{where}: expected a JSON object, got {type(row).__name__}")
        if own is None and is_native(row):
            found.append((task_from_record(row, where), where))
            continue
        fields = fields or schema_fields(path, row, own if own is not None else shared)
        found.append((check_task(row_to_task(row, fields, path, index, where), where), where))
    return found


def load_tasks(paths: Sequence[str | Path], columns: str | None = None) -> list[Task]:
    """Read and validate task sources in order (JSONL, Parquet, ``datasets`` folders, in
    cdscope's format or a known schema -- ``readers``); ``columns`` is a mapping for
    sources that name none. Duplicate ids across sources are errors."""
    if not paths:
        raise CdscopeError("no task files given; pass --tasks FILE.jsonl")
    tasks: list[Task] = []
    first_seen: dict[str, str] = {}
    for raw in paths:
        for task, where in _source_tasks(raw, columns):
            if task.id in first_seen:
                raise CdscopeError(
                    f"{where}: duplicate id {task.id!r} (first at {first_seen[task.id]})"
                )
            first_seen[task.id] = where
            tasks.append(task)
    return tasks


def dumps_tasks(tasks: Sequence[Task]) -> str:
    """The JSONL text of ``tasks`` (one compact object per line, UTF-8, stable key order)."""
    return "".join(json.dumps(t.to_record(), ensure_ascii=False) + "\n" for t in tasks)


def write_tasks(tasks: Sequence[Task], path: Path) -> None:
    """Check every task, then write them as JSONL atomically (never a half-written file)."""
    seen: set[str] = set()
    for index, task in enumerate(tasks):
        check_task(task, f"task {index} ({task.id!r})")
        if task.id in seen:
            raise CdscopeError(f"task {index}: duplicate id {task.id!r}")
        seen.add(task.id)
    data = dumps_tasks(tasks).encode("utf-8")
    atomic_write_bytes(path, lambda tmp: Path(tmp).write_bytes(data))


def default_task_paths(split: Literal["train", "eval"]) -> list[Path]:
    """``<task dir>/<split>/{math,code,logic}.jsonl`` (those present; at least one)."""
    if split not in SPLITS:
        raise CdscopeError(f"unknown task split {split!r}; use one of {', '.join(SPLITS)}")
    directory = default_task_dir() / split
    paths = [directory / f"{family}.jsonl" for family in FAMILIES]
    paths = [p for p in paths if p.is_file()]
    if not paths:
        raise CdscopeError(
            f"no shipped {split} tasks found in {directory}; pass --tasks FILE.jsonl, set "
            "CDSCOPE_TASKS to a folder with train/ and eval/, or run tasks/build_tasks.py"
        )
    return paths


def probe_verifier_kind(item: object) -> str:
    """A probe item's verifier kind: its ``verifier`` key, else its family name."""
    extra = getattr(item, "extra", {}) or {}
    return str(extra.get("verifier") or item.family)  # type: ignore[attr-defined]


def task_from_probe_item(item: object) -> Task:
    """A probe pool item (``cdscope.core.probes.ProbeItem``) as a Task with the same verifier.

    Probe code items store the entry point under ``answer``; math/logic items store the
    reference answer there. Items without a ``verifier`` default to ``math``/``logic`` by
    family; the result is checked like a loaded task.
    """
    extra = dict(getattr(item, "extra", {}) or {})
    family = str(item.family)  # type: ignore[attr-defined]
    kind = probe_verifier_kind(item)
    answer = extra.get("answer")
    fields = {"answer": None if answer is None else str(answer)}
    if is_code_kind(kind):
        fields = {"tests": extra.get("tests"), "entry_point": fields["answer"]}
    task = Task(
        id=str(item.id),  # type: ignore[attr-defined]
        family=family,
        prompt=str(item.prompt),  # type: ignore[attr-defined]
        verifier=kind,
        source=str(getattr(item, "source", "") or "") or None,
        **fields,
    )
    return check_task(task, f"probe item {task.id!r}")
