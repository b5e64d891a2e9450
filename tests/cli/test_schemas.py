"""Every Parquet output has one Arrow schema whatever the run, and ``--json`` is strict JSON.

Each command runs twice on tiny saved models: one model and one seed (one step of training,
one sample per eval problem), then two models and three seeds (three cdrft steps, three
samples). Every file the two runs write must have the same columns with the same Arrow
types, each the type ``cdscope.schemas`` lists for its name, and no column of Arrow type
``null``. The small run also prints ``--json``, parsed by a parser that refuses NaN and
Infinity as strict ones (``JSON.parse``, ``jq``) do.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cdscope.io import read_parquet, write_parquet
from cdscope.schemas import COLUMNS, arrow_table, column_type, strict_json
from tests.helpers import (
    byte_tokenizer,
    invoke,
    tiny_model,
    write_eval_tasks,
    write_pool,
    write_tasks_file,
)


def strict_loads(text: str) -> object:
    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def commands(models: list[Path], seeds: int, out: Path, files: dict[str, Path]) -> dict:
    m = [a for d in models for a in ("-m", d)]
    pool, o = files["pool"], out
    return {
        "probe": ["probe", *m, "-p", pool, "--seeds", seeds, "--n", 2, "-o", o / "probe.parquet"],
        "probe edge": ["probe", *m, "-p", pool, "--seeds", seeds, "--n", 2,
                       "--granularity", "edge", "-o", o / "edge.parquet"],
        "bshared": ["bshared", *m, "-p", pool, "--seeds", seeds, "--n", 2, "-o", o / "b.parquet"],
        "acg": ["acg", "--from", o / "b.probe.parquet", "-o", o / "acg.parquet"],
        "decompose": ["decompose", "--from", o / "b.probe.parquet", "-o", o / "dec.parquet"],
        "nsweep": ["nsweep", *m, "-p", pool, "--seeds", seeds, "--ns", "1,2",
                   "-o", o / "ns.parquet"],
        "random-ref": ["random-ref", "-M", 3, "-K", 6, "-T", 50 * seeds, "-o", o / "rr.parquet"],
        "eap-info": ["eap-info", "-m", models[0], "-p", pool, "--n", 1 + seeds, "--use-targets",
                     *(["--baseline", models[1]] if len(models) > 1 else []),
                     "-o", o / "eap.parquet"],
        "gradcheck": ["gradcheck", *m[:2], "-p", pool, "--seeds", seeds, "--n", 2,
                      "--eps", "0.01", "-o", o / "gc.parquet"],
        "eval": ["eval", *m, "--tasks", files["eval"], "--n", seeds, "--k", "1",
                 "--max-new-tokens", 3, "--out", o / "eval"],
        "eval --audit": ["eval", "--audit", "--tasks", files["eval"], "--audit-train",
                         files["train"], "--out", o / "audit"],
        "train": ["train", "--model", models[0], "--tasks", files["train"], "--probe", pool,
                  "--out-dir", o / "train", "--steps", seeds, "--prompts-per-step", 3,
                  "--group-size", 2, "--max-new-tokens", 3, "--tau", 34, "--k-max", 1,
                  "--regularizer", "cdrft" if seeds > 1 else "none", "--estimator", "proxy",
                  "--probe-n", 2],
    }  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("schemas")
    models = []
    for seed, name in enumerate(("a", "b")):
        tiny_model("llama", "sdpa", seed=seed).save_pretrained(root / name)
        byte_tokenizer().save_pretrained(root / name)
        models.append(root / name)
    files = {
        "pool": write_pool(root / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
        "eval": write_eval_tasks(root / "eval.jsonl"),
        "train": write_tasks_file(root / "train.jsonl"),
    }
    found: dict[str, dict] = {}
    for tag, chosen, seeds in (("small", models[:1], 1), ("big", models, 3)):
        out = root / tag
        printed = {}
        for name, args in commands(chosen, seeds, out, files).items():
            result = invoke(*args, *(["--json"] if tag == "small" else []))
            assert result.exit_code == 0, f"{tag} {name}: {result.output[-2000:]}"
            printed[name] = result.stdout
        found[tag] = {
            "schemas": {
                p.relative_to(out).as_posix(): pq.read_schema(p) for p in out.rglob("*.parquet")
            },
            "json": printed,
        }
    return found


def test_every_output_has_one_schema_whatever_the_run(runs: dict[str, dict]) -> None:
    small, big = runs["small"]["schemas"], runs["big"]["schemas"]
    assert sorted(small) == sorted(big)
    assert len(small) == 23  # every file of every command (eval --audit: contamination)
    for name in sorted(small):
        a = [(f.name, f.type) for f in small[name]]
        b = [(f.name, f.type) for f in big[name]]
        assert a == b, f"{name}: one-model one-seed {a} != two-model three-seed {b}"
        for field in small[name]:
            assert field.type != pa.null(), f"{name}: column {field.name} has Arrow type null"
            assert column_type(field.name) == field.type, (name, field.name, field.type)


def test_one_seed_json_is_strict_and_says_null_for_an_undefined_se(runs: dict) -> None:
    printed = runs["small"]["json"]
    payloads = {
        name: strict_loads(text) for name, text in printed.items() if name != "eval --audit"
    }
    assert {p["command"] for p in payloads.values()} >= {"probe", "bshared", "train", "eval"}
    # one seed: the standard error of each mean is undefined, and says so as null
    summary = payloads["bshared"]["summary"]
    assert summary and all(row["se"] is None for row in summary)
    assert all(isinstance(row["mean"], float) for row in summary)


def test_the_summary_of_one_model_keeps_integer_and_string_columns(runs: dict) -> None:
    schema = runs["small"]["schemas"]["b.summary.parquet"]
    types = {f.name: f.type for f in schema}
    assert types["n_seeds"] == types["n"] == types["n_negative"] == pa.int64()
    assert types["reference"] == pa.large_string() and types["seeds_needed"] == pa.float64()


# -- the pieces themselves ---------------------------------------------------------------


def test_arrow_table_types_missing_values_by_column_name(tmp_path: Path) -> None:
    frame = pd.DataFrame(
        {
            "model": [None, None],  # all missing: still a string column
            "n": [3.0, math.nan],  # whole numbers and NaN: int64 with a null
            "n_seeds": [None, 2],
            "passed": [True, None],
            "mean": [None, None],
            "not_a_cdscope_column": [1, 2],  # inferred
        }
    )
    table = arrow_table(frame)
    assert table.schema.field("model").type == pa.large_string()
    assert table.column("n").to_pylist() == [3, None] and table.schema.field("n").type == pa.int64()
    assert table.column("n_seeds").to_pylist() == [None, 2]
    assert table.schema.field("passed").type == pa.bool_()
    assert table.schema.field("mean").type == pa.float64()
    assert table.schema.field("not_a_cdscope_column").type == pa.int64()
    write_parquet(frame, tmp_path / "x.parquet", {"se": math.nan, "ok": [1.5, math.inf]})
    back, meta = read_parquet(tmp_path / "x.parquet")
    assert str(back["n"].dtype) == "Int64" and back["n"].isna().tolist() == [False, True]
    assert meta == {"se": None, "ok": [1.5, None]}  # strict JSON in the file's metadata too
    strict_loads(pq.read_schema(tmp_path / "x.parquet").metadata[b"cdscope"].decode())


def test_a_fractional_count_is_refused_not_rounded() -> None:
    with pytest.raises((TypeError, ValueError)):
        arrow_table(pd.DataFrame({"n": [1.5]}))


def test_strict_json_maps_every_non_finite_and_missing_value_to_null() -> None:
    value = {
        "nan": math.nan, "inf": math.inf, "-inf": -math.inf, "f32": np.float32("nan"),
        "arr": np.array([1.0, np.nan]), "na": pd.NA, "nat": pd.NaT, "ok": np.int64(3),
        1: (2.5, {"x": [math.nan]}), "path": Path("a/b"),
    }  # fmt: skip
    assert strict_json(value) == {
        "nan": None, "inf": None, "-inf": None, "f32": None, "arr": [1.0, None], "na": None,
        "nat": None, "ok": 3, "1": [2.5, {"x": [None]}], "path": "a/b",
    }  # fmt: skip
    assert strict_loads(json.dumps(strict_json(value), allow_nan=False))


def test_every_listed_type_is_a_plain_arrow_type() -> None:
    allowed = {pa.large_string(), pa.int64(), pa.float64(), pa.bool_(), pa.list_(pa.float64())}
    assert set(COLUMNS.values()) <= allowed
