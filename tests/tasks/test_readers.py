"""Benchmarks people bring (--tasks): JSONL, Parquet and datasets folders in the common
schemas, on small synthetic stand-ins written in those schemas (no download); verifier
plugins from Python and through an entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdscope.errors import CdscopeError
from cdscope.tasks import load_tasks, register_verifier, verify
from cdscope.tasks.io.readers import with_mapping
from cdscope.tasks.judging import registry as reg
from cdscope.tasks.sandbox import code_sandbox_available

GSM8K = [
    {
        "question": "Tom has 3 apples and buys 1,231 more. How many?",
        "answer": "3+1231=1234\n#### 1,234",
    },
    {"question": "What is 10 - 4?", "answer": "10-4=6\n#### 6"},
]
MATH = [
    {
        "problem": "Compute 1/4 + 1/4.",
        "solution": "We get $\\boxed{\\frac{1}{2}}$.",
        "level": "Level 1",
    },
    {
        "problem": "What is $\\sqrt{8}/2$?",
        "solution": "It is $\\boxed{\\sqrt{2}}$.",
        "level": "Level 2",
    },
]
HUMANEVAL = [
    {
        "task_id": "HumanEval/900",
        "prompt": 'def inc(x: int) -> int:\n    """Add one.\n    >>> inc(1)\n    2\n    """\n',
        "canonical_solution": "    return x + 1\n",
        "test": "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n",
        "entry_point": "inc",
    }
]
MBPP = [
    {
        "task_id": 901,
        "text": "Write a function to add two numbers.",
        "code": "def add_nums(a, b):\n    return a + b",
        "test_list": ["assert add_nums(1, 2) == 3", "assert add_nums(-1, 1) == 0"],
        "test_setup_code": "",
    }
]
needs_sandbox = pytest.mark.skipif(not code_sandbox_available()[0], reason="no code sandbox")


def _write(rows: list[dict], path: Path, kind: str) -> Path:
    if kind == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif kind == "parquet":
        path = path.with_suffix(".parquet")
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        datasets = pytest.importorskip("datasets")
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "datasets"])
def test_gsm8k_and_math_rows_become_math_tasks(tmp_path, kind: str) -> None:
    gsm = load_tasks([_write(GSM8K, tmp_path / "gsm8k", kind)])
    assert [t.answer for t in gsm] == ["1234", "6"]
    assert {t.verifier for t in gsm} == {"math"} and gsm[0].prompt == GSM8K[0]["question"]
    assert [t.id for t in gsm] == ["gsm8k/0", "gsm8k/1"]
    assert verify(gsm[0], "3 + 1231 = 1234.\n#### 1234").passed
    assert not verify(gsm[0], "#### 1235").passed
    math = load_tasks([_write(MATH, tmp_path / "math", kind)])
    assert [t.answer for t in math] == ["\\frac{1}{2}", "\\sqrt{2}"]
    assert verify(math[0], "So the sum is $\\boxed{0.5}$.").passed
    assert verify(math[1], "Final answer: $\\frac{2\\sqrt{2}}{2}$").passed  # math-verify
    assert not verify(math[1], "\\boxed{2}").passed


@needs_sandbox
@pytest.mark.parametrize("kind", ["jsonl", "parquet", "datasets"])
def test_humaneval_and_mbpp_rows_become_code_tasks(tmp_path, kind: str) -> None:
    (human,) = load_tasks([_write(HUMANEVAL, tmp_path / "he", kind)])
    assert (human.id, human.verifier, human.entry_point) == ("HumanEval/900", "code", "inc")
    (mbpp,) = load_tasks([_write(MBPP, tmp_path / "mbpp", kind)])
    assert (mbpp.id, mbpp.verifier, mbpp.entry_point) == ("901", "code:program", "add_nums")
    assert "assert add_nums(1, 2) == 3" in mbpp.prompt  # MBPP prompts show the tests
    chat = "Here you go:\n```python\ndef add_nums(a, b):\n    return a + b\n\nprint(add_nums(1, 2))\n```"
    verdicts = [
        verify(human, HUMANEVAL[0]["canonical_solution"]),
        verify(human, "    return x\n"),
        verify(mbpp, chat),
        verify(mbpp, "```python\ndef add_nums(a, b):\n    return a - b\n```"),
    ]
    assert [v.passed for v in verdicts] == [True, False, True, False], verdicts


def test_column_mappings_and_their_errors(tmp_path) -> None:
    rows = [
        {"q": "What is 2 + 2?", "a": "4", "uid": "x1"},
        {"q": "Say yes.", "a": "Yes", "uid": "x2"},
    ]
    path = _write(rows, tmp_path / "custom", "parquet")
    with pytest.raises(CdscopeError, match="cannot tell the schema .*columns: a, q, uid"):
        load_tasks([path])
    tasks = load_tasks([path], columns="prompt=q,answer=a,id=uid,verifier=logic,family=quiz")
    assert [(t.id, t.family, t.verifier, t.answer) for t in tasks] == [
        ("x1", "quiz", "logic", "4"),
        ("x2", "quiz", "logic", "Yes"),
    ]
    assert load_tasks([f"{path}?prompt=q,answer=a,id=uid,verifier=logic"])[1].id == "x2"
    native = tmp_path / "native.jsonl"  # --task-columns leaves files in cdscope's format alone
    native.write_text(
        json.dumps({"id": "n/1", "family": "m", "prompt": "p", "verifier": "math", "answer": "1"})
        + "\n"
    )
    assert len(load_tasks([native, path], columns="prompt=q,answer=a,id=uid")) == 3
    sources = [with_mapping(p, "prompt=q,answer=a,id=uid") for p in (native, path)]  # train's
    assert sources == [str(native), f"{path}?prompt=q,answer=a,id=uid"]
    assert len(load_tasks(sources)) == 3
    for bad, message in [
        ("prompt=q,answer=nope", "no column 'nope'"),
        ("schema=gsm9k", "unknown schema 'gsm9k'"),
        ("prompt=q,colour=a", "bad mapping item 'colour=a'"),
        ("prompt=q,answer=a,verifier=nope", "unknown verifier kind 'nope'"),
    ]:
        with pytest.raises(CdscopeError, match=message):
            load_tasks([path], columns=bad)
    broken = _write([{"question": "q", "answer": "no marker"}], tmp_path / "broken", "jsonl")
    with pytest.raises(CdscopeError, match=r"broken.jsonl:1: the answer has no '#### N' line"):
        load_tasks([broken])
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "dd"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(GSM8K)}).save_to_disk(str(folder))
    with pytest.raises(CdscopeError, match="DatasetDict with splits test; pass one split"):
        load_tasks([folder])
    assert len(load_tasks([folder / "test"])) == 2


@pytest.fixture
def registry_snapshot():
    saved, loaded = dict(reg.VERIFIERS), reg._plugins_loaded
    yield
    reg.VERIFIERS.clear()
    reg.VERIFIERS.update(saved)
    reg._plugins_loaded = loaded


def test_register_verifier_from_python(tmp_path, registry_snapshot) -> None:
    def exact_upper(task, completion, *, timeout):
        return completion.strip() == (task.answer or "").upper(), "upper-case match"

    register_verifier("upper", exact_upper)
    path = tmp_path / "t.jsonl"
    row = {"id": "u/1", "family": "text", "prompt": "shout hi", "verifier": "upper", "answer": "hi"}
    path.write_text(json.dumps(row) + "\n")
    (task,) = load_tasks([path])
    assert verify(task, "HI").passed and not verify(task, "hi").passed
    with pytest.raises(CdscopeError, match="already registered"):
        register_verifier("upper", lambda *a, **k: True)
    register_verifier("bad", lambda *a, **k: "yes")
    with pytest.raises(CdscopeError, match="returned str; return a Verdict"):
        verify(type(task)("b/1", "text", "p", "bad", answer="x"), "x")


def test_register_verifier_through_an_entry_point(tmp_path, monkeypatch, registry_snapshot) -> None:
    """A package's ``[project.entry-points."cdscope.verifiers"]`` makes a kind known: an
    installed distribution is metadata on sys.path, written here by hand."""
    package = tmp_path / "cdscope_plugin_demo"
    package.mkdir()
    (package / "__init__.py").write_text(
        "def palindrome(task, completion, *, timeout):\n"
        "    text = completion.strip().lower()\n"
        "    return text == text[::-1] and len(text) > 1\n"
    )
    info = tmp_path / "cdscope_plugin_demo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: cdscope-plugin-demo\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(
        f"[{reg.ENTRY_POINT_GROUP}]\npalindrome = cdscope_plugin_demo:palindrome\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reg._plugins_loaded = False
    path = tmp_path / "t.jsonl"
    row = {
        "id": "p/1",
        "family": "text",
        "prompt": "a palindrome?",
        "verifier": "palindrome",
        "answer": "-",
    }
    path.write_text(json.dumps(row) + "\n")
    (task,) = load_tasks([path])  # the kind is known only through the entry point
    assert verify(task, "Level").passed and not verify(task, "levels").passed
    assert "palindrome" in reg.verifier_kinds()
