"""Benchmarks people bring: task rows from JSONL, Parquet or a ``datasets`` folder (SPEC §7).

A task *source* is a path, optionally followed by ``?`` and a column mapping
(``gsm8k.parquet?schema=gsm8k`` or ``data.jsonl?prompt=q,answer=a``); the CLI's
``--task-columns MAPPING`` applies to every ``--tasks`` source not in cdscope's own format
(train appends it to each such path, ``with_mapping``). Files:

* ``.jsonl`` / ``.json`` -- JSON lines; rows that carry cdscope's own keys (``id``,
  ``family``, ``prompt``, ``verifier``) are read as task records (``format.parse_task``);
* ``.parquet`` -- one row per task;
* a folder written by ``datasets.Dataset.save_to_disk`` (``state.json`` + Arrow files;
  read with pyarrow, no ``datasets`` needed); a ``DatasetDict`` folder names its splits.

Rows in another schema are converted by a *schema*, found from the columns or named in
the mapping (``schema=NAME``):

| schema | columns | task |
|---|---|---|
| ``gsm8k`` | ``question``, ``answer`` | math; the reference is what follows the last ``####`` |
| ``math`` | ``problem``, ``solution`` | math; the reference is the solution's last ``\\boxed{}`` |
| ``humaneval`` | ``task_id``, ``prompt``, ``test``, ``entry_point`` | code (program = prompt + completion) |
| ``mbpp`` | ``text``, ``test_list`` (``test_setup_code``) | ``code:program``; the prompt shows the tests, the entry point is the function they call |
| ``columns`` | named in the mapping | as mapped |

A mapping item ``field=column`` maps a task field to a column (``id``, ``prompt``,
``answer``, ``tests``, ``entry_point``; a schema's defaults are overridden one by one);
``verifier=KIND`` and ``family=NAME`` are literal values, not columns. Ids default to
``<file stem>/<row>``. Every error names the source and the row.
"""

from __future__ import annotations

import ast
import builtins
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from cdscope.errors import CdscopeError
from cdscope.io import jsonl_lines
from cdscope.tasks.judging import find_final_answer
from cdscope.tasks.record import PROGRAM_KIND, Task

FIELDS = ("id", "prompt", "answer", "tests", "entry_point")
LITERALS = ("verifier", "family")
SCHEMAS: dict[str, dict[str, str]] = {
    "gsm8k": {"prompt": "question", "answer": "answer", "verifier": "math"},
    "math": {"prompt": "problem", "answer": "solution", "verifier": "math"},
    "humaneval": {
        "id": "task_id",
        "prompt": "prompt",
        "tests": "test",
        "entry_point": "entry_point",
        "verifier": "code",
    },
    "mbpp": {"id": "task_id", "prompt": "text", "tests": "test_list", "verifier": PROGRAM_KIND},
    "columns": {},
}
_SIGNATURES = [  # columns that identify a schema, most specific first
    ("humaneval", {"prompt", "test", "entry_point"}),
    ("mbpp", {"text", "test_list"}),
    ("math", {"problem", "solution"}),
    ("gsm8k", {"question", "answer"}),
]


def split_source(source: str | Path) -> tuple[Path, dict[str, str] | None]:
    """``PATH?MAPPING`` -> ``(PATH, parsed mapping)``; no ``?`` -> ``(PATH, None)``."""
    text = str(source)
    path, mark, spec = text.partition("?")
    if not mark or Path(text).exists():
        return Path(text), None
    return Path(path), parse_mapping(spec, text)


def with_mapping(path: str | Path, columns: str | None) -> str:
    """The source string of ``path`` read with ``columns`` (``PATH?MAPPING``); unchanged
    without columns or when ``path`` is in cdscope's own format (its first row)."""
    if not columns:
        return str(path)
    parse_mapping(columns)  # refuse a bad mapping before anything runs
    source, own = split_source(path)
    if own is not None or is_native(read_rows(source)[0][0]):
        return str(path)
    return f"{path}?{columns}"


def parse_mapping(spec: str, where: str = "--task-columns") -> dict[str, str]:
    """``schema=gsm8k,prompt=question`` (or a bare schema name) -> a mapping dict."""
    mapping: dict[str, str] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        key, mark, value = (part.strip() for part in item.partition("="))
        if not mark:
            key, value = "schema", key
        if key == "schema" and value not in SCHEMAS:
            raise CdscopeError(f"{where}: unknown schema {value!r} (known: {', '.join(SCHEMAS)})")
        if key not in (*FIELDS, *LITERALS, "schema") or not value:
            raise CdscopeError(
                f"{where}: bad mapping item {item!r}; write field=column with a field of "
                f"{', '.join(FIELDS)}, or verifier=KIND, family=NAME, schema=NAME"
            )
        mapping[key] = value
    return mapping


def _dataset_folder(path: Path) -> pa.Table:
    if (path / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in path.iterdir() if (p / "state.json").is_file())
        raise CdscopeError(
            f"{path} holds a DatasetDict with splits {', '.join(splits) or '(none)'}; pass one "
            f"split's folder, e.g. {path / (splits[0] if splits else 'test')}"
        )
    try:
        state = json.loads((path / "state.json").read_text("utf-8"))
        files = [path / entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CdscopeError(
            f"{path}: not a folder written by datasets' save_to_disk (state.json: {exc})"
        ) from None
    tables = []
    for file in files:
        try:
            with pa.memory_map(str(file)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except (OSError, pa.ArrowInvalid) as exc:
            raise CdscopeError(f"cannot read {file}: {exc}") from None
    return pa.concat_tables(tables) if tables else pa.table({})


def read_rows(path: Path) -> list[tuple[dict, str]]:
    """``(row, where)`` for every row of a JSONL file, Parquet file or datasets folder."""
    if path.is_dir():
        rows = _dataset_folder(path).to_pylist()
    elif path.suffix == ".parquet":
        try:
            rows = pq.read_table(path).to_pylist()
        except (OSError, pa.ArrowInvalid) as exc:
            raise CdscopeError(f"cannot read task file {path}: {exc}") from None
    else:
        out = []
        for line, where in jsonl_lines(path, "task", "no tasks"):
            try:
                out.append((json.loads(line), where))
            except json.JSONDecodeError as exc:
                raise CdscopeError(f"{where}: not valid JSON ({exc.msg})") from None
        return out
    if not rows:
        raise CdscopeError(f"task source {path} has no rows")
    return [(row, f"{path}[row {index}]") for index, row in enumerate(rows)]


def is_native(row: object) -> bool:
    """Whether a row is meant as a cdscope task record (it carries ``verifier`` or
    ``family``; a record missing other keys then gets cdscope's own error)."""
    return isinstance(row, dict) and ("verifier" in row or "family" in row)


def schema_fields(path: Path, row: dict, mapping: dict[str, str]) -> dict[str, str]:
    """The field -> column mapping of ``path``'s rows: the named or recognised schema's,
    with ``mapping``'s items on top (``schema`` holds the schema's name)."""
    name = mapping.get("schema")
    if name is None and "prompt" in mapping:
        name = "columns"
    if name is None:
        name = next((n for n, cols in _SIGNATURES if cols <= set(row)), None)
    if name is None:
        raise CdscopeError(
            f"cannot tell the schema of {path} (columns: {', '.join(sorted(row)) or 'none'}); "
            "pass --task-columns schema=gsm8k|math|humaneval|mbpp or prompt=COL,answer=COL"
        )
    merged = {**SCHEMAS[name], **{k: v for k, v in mapping.items() if k != "schema"}}
    merged["schema"] = name
    return merged


def _text(row: dict, column: str, where: str) -> str:
    if column not in row:
        raise CdscopeError(f"{where}: no column {column!r} (columns: {', '.join(sorted(row))})")
    value = row[column]
    if isinstance(value, list | tuple):
        return "\n".join(str(v) for v in value)
    if value is None:
        raise CdscopeError(f"{where}: column {column!r} is empty")
    return str(value)


def gsm8k_answer(solution: str, where: str) -> str:
    """The number after the last ``####`` of a GSM8K solution (thousands commas dropped)."""
    marker = solution.rfind("####")
    if marker < 0 or not solution[marker + 4 :].strip():
        raise CdscopeError(f"{where}: the answer has no '#### N' line (a GSM8K solution)")
    return solution[marker + 4 :].strip().splitlines()[0].strip().replace(",", "")


def math_answer(solution: str, where: str) -> str:
    """The last ``\\boxed{}`` of a MATH solution."""
    found = find_final_answer(solution)
    if found is None or found.how != "boxed":
        raise CdscopeError(f"{where}: the solution has no \\boxed{{}} answer (a MATH solution)")
    return found.text


def mbpp_entry_point(asserts: list[str], where: str) -> str:
    """The function MBPP's asserts call most often (builtins and methods aside)."""
    counts: dict[str, int] = {}
    for line in asserts:
        try:
            tree = ast.parse(line)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                name = node.func.id
                if not hasattr(builtins, name):
                    counts[name] = counts.get(name, 0) + 1
    if not counts:
        raise CdscopeError(f"{where}: no function call in the MBPP tests to take as entry point")
    return max(counts, key=lambda name: counts[name])


def _mbpp(row: dict, fields: dict[str, str], where: str) -> dict[str, str]:
    raw = row.get(fields["tests"])
    asserts = [str(a) for a in raw] if isinstance(raw, list | tuple) else str(raw).splitlines()
    asserts = [a.strip() for a in asserts if a and a.strip()]
    entry = row.get(fields["entry_point"]) if "entry_point" in fields else None
    entry = str(entry) if entry else mbpp_entry_point(asserts, where)
    setup = str(row.get("test_setup_code") or "")
    text = _text(row, fields["prompt"], where)
    return {
        "prompt": f"{text}\nYour code should pass these tests:\n" + "\n".join(asserts) + "\n",
        "tests": setup + "\ndef check(candidate):\n" + "".join(f"    {a}\n" for a in asserts),
        "entry_point": entry,
    }


def row_to_task(row: dict, fields: dict[str, str], source: Path, index: int, where: str) -> Task:
    """One row in a schema -> a Task (checked later like a loaded one)."""
    schema, verifier = fields["schema"], fields.get("verifier")
    if schema == "mbpp":
        values = _mbpp(row, fields, where)
    else:
        values = {k: _text(row, fields[k], where) for k in FIELDS[1:] if k in fields}
        if schema == "gsm8k":
            values["answer"] = gsm8k_answer(values["answer"], where)
        elif schema == "math":
            values["answer"] = math_answer(values["answer"], where)
    if verifier is None:
        verifier = "math" if "answer" in values else "code"
    family = fields.get("family") or verifier.split(":")[0]
    row_id = row.get(fields["id"]) if "id" in fields else None
    task_id = str(row_id) if row_id not in (None, "") else f"{source.stem}/{index}"
    meta = {"source_row": index, "schema": schema}
    return Task(
        id=task_id, family=family, verifier=verifier, source=str(source), meta=meta, **values
    )
