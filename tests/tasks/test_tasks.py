"""Task files: the JSONL format (file:line errors), atomic writes, and the shipped sets."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from cdscope.core.probes import load_pool
from cdscope.errors import CdscopeError
from cdscope.resources import default_task_dir
from cdscope.tasks import (
    VERIFIERS,
    Task,
    default_task_paths,
    load_tasks,
    task_from_probe_item,
    verify,
    write_tasks,
)

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "cdscope" / "data" / "probes"  # shipped pools (package data)
TASKS = ROOT / "cdscope" / "data" / "tasks"  # shipped task sets (package data)
GOOD = {
    "id": "m/1",
    "family": "math",
    "prompt": "1+1?\nSolution:\n",
    "verifier": "math",
    "answer": "2",
}
CODE = {
    "id": "c/1",
    "family": "code",
    "prompt": "def f():\n",
    "verifier": "code",
    "tests": "def check(c):\n    assert c() == 1\n",
    "entry_point": "f",
}


def normalise(text: str) -> str:
    return re.sub(r"[^0-9a-z]", "", text.casefold())


# -- format ----------------------------------------------------------------------------
def test_round_trip_through_write_and_load(tmp_path) -> None:
    tasks = [
        Task(**GOOD, source="hand", meta={"generator": "x", "index": 3}),
        Task(**CODE),
        Task("l/1", "logic", "p", "logic:syllogism", answer="Yes"),
    ]
    path = tmp_path / "sub" / "tasks.jsonl"
    write_tasks(tasks, path)
    loaded = load_tasks([path])
    assert loaded == tasks and loaded[0].meta == {"generator": "x", "index": 3}
    assert "null" not in path.read_text()  # None fields are left out


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"bad\.jsonl:2: not valid JSON"),
        ('["a list"]', r"bad\.jsonl:2: expected a JSON object"),
        (
            json.dumps({**GOOD, "id": "m/2"} | {"verifier": None}),
            r"bad\.jsonl:2: 'verifier' must be",
        ),
        (
            json.dumps({"id": "m/2", "family": "math", "prompt": "p"}),
            r":2: missing key\(s\) verifier",
        ),
        (json.dumps({**GOOD, "id": "m/2", "target": "x"}), r":2: unknown key\(s\) target"),
        (
            json.dumps({**GOOD, "id": "m/2", "verifier": "magic"}),
            r":2: unknown verifier kind 'magic'",
        ),
        (
            json.dumps({**GOOD, "id": "m/2", "answer": None}),
            r":2: verifier 'math' needs .*'answer'",
        ),
        (json.dumps({**GOOD, "id": "m/2", "answer": 2}), r":2: 'answer' must be a string"),
        (json.dumps({**CODE, "tests": ""}), r":2: verifier 'code' needs .*'tests'"),
        (json.dumps({k: v for k, v in CODE.items() if k != "entry_point"}), r":2: .*'entry_point'"),
        (json.dumps({**GOOD, "id": "m/2", "meta": [1]}), r":2: 'meta' must be a JSON object"),
        (json.dumps(GOOD), r":2: duplicate id 'm/1' \(first at .*bad\.jsonl:1\)"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line: str, message: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GOOD) + "\n" + line + "\n")
    with pytest.raises(CdscopeError, match=message):
        load_tasks([bad])


def test_missing_and_empty_files_are_user_errors(tmp_path) -> None:
    with pytest.raises(CdscopeError, match="task file not found"):
        load_tasks([tmp_path / "nope.jsonl"])
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(CdscopeError, match="has no tasks"):
        load_tasks([tmp_path / "empty.jsonl"])
    with pytest.raises(CdscopeError, match="no task files"):
        load_tasks([])


def test_write_refuses_bad_tasks_and_leaves_the_old_file(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    write_tasks([Task(**GOOD)], path)
    before = path.read_bytes()
    with pytest.raises(CdscopeError, match="needs a non-empty string 'answer'"):
        write_tasks([Task(**GOOD), Task("m/2", "math", "p", "math")], path)
    with pytest.raises(CdscopeError, match="duplicate id"):
        write_tasks([Task(**GOOD), Task(**GOOD)], path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]  # no temp files left


def test_default_paths_follow_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CDSCOPE_TASKS", str(tmp_path))
    with pytest.raises(CdscopeError, match="no shipped train tasks"):
        default_task_paths("train")
    write_tasks([Task(**GOOD)], tmp_path / "train" / "math.jsonl")
    assert default_task_paths("train") == [tmp_path / "train" / "math.jsonl"]
    with pytest.raises(CdscopeError, match="unknown task split"):
        default_task_paths("test")  # type: ignore[arg-type]


def test_probe_items_convert_to_tasks() -> None:
    pool = load_pool([PROBES / f"{f}.jsonl" for f in ("math", "code", "logic")])
    for family, items in pool.by_family.items():
        for item in items:
            task = task_from_probe_item(item)
            assert task.verifier in VERIFIERS and task.family == family
            if family == "code":
                assert task.entry_point == item.extra["answer"] and task.tests


# -- the shipped sets ---------------------------------------------------------------------
SIZES = {
    "train": {"math": 128, "code": 50, "logic": 128},
    "eval": {"math": 48, "code": 50, "logic": 48},
}


def shipped(split: str) -> list[Task]:
    return load_tasks(default_task_paths(split))


def test_shipped_sets_have_the_documented_sizes() -> None:
    assert default_task_dir() == TASKS
    for split, sizes in SIZES.items():
        tasks = shipped(split)
        counts = {f: sum(t.family == f for t in tasks) for f in sizes}
        assert counts == sizes
        for task in tasks:
            assert task.id.startswith(f"{task.family}/")
            if task.family != "code":
                assert task.prompt.endswith("\nSolution:\n") and task.meta["generator"]


def test_probe_train_and_eval_are_pairwise_disjoint() -> None:
    pool = load_pool([PROBES / f"{f}.jsonl" for f in ("math", "code", "logic")])
    sets = {
        "probe": [(i.id, i.prompt, i.source) for items in pool.by_family.values() for i in items],
        "train": [(t.id, t.prompt, t.source) for t in shipped("train")],
        "eval": [(t.id, t.prompt, t.source) for t in shipped("eval")],
    }
    names = list(sets)
    for a in names:
        for b in names[names.index(a) + 1 :]:
            for position, what in ((0, "id"), (2, "source")):
                shared = {x[position] for x in sets[a]} & {x[position] for x in sets[b]}
                assert not shared, f"{a} and {b} share {what}s: {sorted(shared)[:3]}"
            shared = {normalise(x[1]) for x in sets[a]} & {normalise(x[1]) for x in sets[b]}
            assert not shared, f"{a} and {b} share normalised prompts"


def test_manifest_records_the_files() -> None:
    manifest = json.loads((TASKS / "MANIFEST.json").read_text())
    assert manifest["built_by"] == "tasks/build_tasks.py"
    for split, families in manifest["splits"].items():
        for family, entry in families.items():
            data = (TASKS / entry["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == entry["sha256"]
            assert entry["n_tasks"] == SIZES[split][family] == data.count(b"\n")


def test_held_out_indices_were_skipped() -> None:
    """No shipped item is an index the probe MANIFEST told consumers to skip."""
    probe_manifest = json.loads((PROBES / "MANIFEST.json").read_text())
    skip = {}
    for family in ("math", "logic"):
        for gen in probe_manifest["families"][family]["generators"]:
            for split in ("train", "eval"):
                held = gen[split]
                skip[(gen["name"], held["seed"])] = set(held["exclude_indices"]) | set(
                    held["unconfirmed_indices"]
                )
    for split in ("train", "eval"):
        for task in shipped(split):
            if task.family == "code":
                assert task.meta["task_id"] in probe_manifest["families"]["code"][split]
                continue
            key = (task.meta["generator"], task.meta["seed"])
            assert task.meta["seed"] == (2000 if split == "train" else 3000)
            assert task.meta["index"] not in skip[key], task.id


@pytest.mark.parametrize("split", ["train", "eval"])
def test_shipped_math_and_logic_references_verify(split: str) -> None:
    for task in shipped(split):
        if task.family != "code":
            assert verify(task, f"Work.\nThe answer is {task.answer}.").passed, task.id
