"""The learnable curriculum (cdscope/data/tasks/curriculum/, built by tasks/build_tasks.py):
sizes and hashes as the MANIFEST records them, held-out splits, references that verify
and near misses that do not, and the default task paths when CDSCOPE_TASKS points at it."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

import pytest

from cdscope.resources import default_task_dir
from cdscope.tasks import default_task_paths, load_tasks, verify
from cdscope.tasks.sandbox import sandbox_available

CURRICULUM = default_task_dir() / "curriculum"
MANIFEST = json.loads((default_task_dir() / "MANIFEST.json").read_text())["curriculum"]
PER_GENERATOR = {"train": 32, "eval": 12}
GENERATORS = {
    "math": ["add", "sub", "mul", "add2"],
    "code": ["arith", "compare", "index", "aggregate"],
    "logic": ["smaller", "largest", "count", "sort3"],
}


def tasks(split: str, family: str):
    return load_tasks([CURRICULUM / split / f"{family}.jsonl"])


def normalise(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.casefold())


@pytest.mark.parametrize("split", ["train", "eval"])
def test_sizes_and_hashes_match_the_manifest(split: str) -> None:
    for family, names in GENERATORS.items():
        entry = MANIFEST["splits"][split][family]
        data = (default_task_dir() / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        loaded = tasks(split, family)
        assert len(loaded) == entry["n_tasks"] == PER_GENERATOR[split] * len(names)
        assert Counter(t.meta["generator"] for t in loaded) == dict.fromkeys(
            names, PER_GENERATOR[split]
        )
        assert {t.family for t in loaded} == {family}


def test_eval_is_held_out_from_train() -> None:
    for family in GENERATORS:
        train, held = tasks("train", family), tasks("eval", family)
        assert not {t.id for t in train} & {t.id for t in held}
        assert not {normalise(t.prompt) for t in train} & {normalise(t.prompt) for t in held}
        for split in (train, held):  # no task repeats another of its split
            assert len({normalise(t.prompt) for t in split}) == len(split)


def test_default_paths_find_the_curriculum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDSCOPE_TASKS", str(CURRICULUM))
    assert default_task_paths("train") == [
        CURRICULUM / "train" / f"{f}.jsonl" for f in ("math", "code", "logic")
    ]


@pytest.mark.parametrize("family", ["math", "logic"])
def test_references_pass_and_near_misses_fail(family: str) -> None:
    for split in ("train", "eval"):
        for task in tasks(split, family):
            reference = task.meta["reference"]
            assert verify(task, f"The answer is {reference}.").passed, task.id
            numbers = reference.split(", ")
            wrong = ", ".join([*numbers[:-1], str(int(numbers[-1]) + 1)])
            assert not verify(task, f"The answer is {wrong}.").passed, task.id
            assert not verify(task, "").passed, task.id


@pytest.mark.skipif(not sandbox_available()[0], reason="no code sandbox on this machine")
def test_code_references_pass_and_a_stub_fails() -> None:
    """One task per code generator (the build checks all of them, with near misses)."""
    for name in GENERATORS["code"]:
        task = next(t for t in tasks("eval", "code") if t.meta["generator"] == name)
        assert task.prompt.endswith("\n    return")
        assert verify(task, f" {task.meta['reference']}\n").passed, task.id
        assert not verify(task, " None\n").passed, task.id
