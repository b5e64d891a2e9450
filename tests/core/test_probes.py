"""Probe pools: validation with file:line errors, seeded draws, teacher-forcing batches (SPEC §2, §4)."""

from __future__ import annotations

import json

import pytest
import torch

from cdscope.core.batch import encode_probe
from cdscope.core.probes import default_pool_paths, draw_probe, load_pool
from cdscope.errors import CdscopeError
from tests.helpers import write_pool


def test_draw_is_deterministic_and_without_replacement(pool_file) -> None:
    pool = load_pool([pool_file])
    first = draw_probe(pool, seed=3, n=3)
    assert [i.id for i in first] == [i.id for i in draw_probe(pool, seed=3, n=3)]
    for family in pool.families:
        ids = [i.id for i in first if i.family == family]
        assert len(ids) == len(set(ids)) == 3
    seeds = {tuple(i.id for i in draw_probe(pool, seed=s, n=3)) for s in range(8)}
    assert len(seeds) > 1


def test_draw_of_a_family_does_not_depend_on_other_families(tmp_path) -> None:
    small = load_pool([write_pool(tmp_path / "a.jsonl", {"math": 6, "code": 6})])
    big = load_pool([write_pool(tmp_path / "b.jsonl", {"math": 6, "code": 6, "zz": 9})])
    pick = lambda pool: [i.id for i in draw_probe(pool, 5, 2) if i.family == "math"]  # noqa: E731
    assert pick(small) == pick(big)


def test_pool_hash_is_content_based(tmp_path) -> None:
    a = load_pool([write_pool(tmp_path / "a.jsonl", {"math": 4, "code": 4})])
    b = load_pool([write_pool(tmp_path / "b.jsonl", {"math": 4, "code": 4})])
    c = load_pool([write_pool(tmp_path / "c.jsonl", {"math": 4, "code": 5})])
    assert a.hash == b.hash != c.hash


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"bad\.jsonl:2: not valid JSON"),
        ('["a list"]', r"bad\.jsonl:2: expected a JSON object"),
        ('{"id": "x", "family": "f", "prompt": "p"}', r"bad\.jsonl:2: missing key\(s\) target"),
        (
            '{"id": "x", "family": "f", "prompt": "p", "target": 3}',
            r"bad\.jsonl:2: 'target' must be a non-empty string",
        ),
        (
            '{"id": "ok", "family": "f", "prompt": "p", "target": "t"}',
            r"bad\.jsonl:2: duplicate id 'ok'",
        ),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path, line: str, message: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"id": "ok", "family": "f", "prompt": "p", "target": "t"}) + "\n" + line + "\n"
    )
    with pytest.raises(CdscopeError, match=message):
        load_pool([bad])


def test_empty_pool_file_and_missing_file_are_refused(tmp_path) -> None:
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(CdscopeError, match="has no items"):
        load_pool([tmp_path / "empty.jsonl"])
    with pytest.raises(CdscopeError, match="not found"):
        load_pool([tmp_path / "nope.jsonl"])


def test_family_smaller_than_n_is_refused(tmp_path) -> None:
    pool = load_pool([write_pool(tmp_path / "p.jsonl", {"math": 5, "code": 2})])
    with pytest.raises(CdscopeError, match="'code' has 2 probe item"):
        draw_probe(pool, 0, 3)
    with pytest.raises(CdscopeError, match="no items"):
        draw_probe(pool, 0, 1, families=["logic"])


def test_shipped_pools_load_and_cover_three_families() -> None:
    pool = load_pool(default_pool_paths())
    assert pool.families == ["code", "logic", "math"]
    assert all(len(items) >= 60 for items in pool.by_family.values())


def test_plain_batch_scores_exactly_the_target_tokens(pool_file, tokenizer) -> None:
    items = draw_probe(load_pool([pool_file]), 0, 2)
    batch = encode_probe(items, tokenizer, "plain", pad_id=258)
    rows = torch.arange(batch.B)
    local, pos, labels = batch.predicting_positions(rows)
    for b, item in enumerate(items):
        target_ids = tokenizer(item.target, add_special_tokens=False)["input_ids"]
        assert labels[local == b].tolist() == target_ids
        prompt_ids = tokenizer(item.prompt)["input_ids"]
        assert batch.input_ids[b, : len(prompt_ids)].tolist() == prompt_ids
        assert (batch.input_ids[b, int(batch.lengths[b]) :] == 258).all()
    assert batch.families == ["code", "logic", "math"]


def test_chat_template_without_one_is_refused(pool_file, tokenizer) -> None:
    items = draw_probe(load_pool([pool_file]), 0, 1)
    with pytest.raises(CdscopeError, match="no chat template"):
        encode_probe(items, tokenizer, "chat")
    with pytest.raises(CdscopeError, match="--template must be"):
        encode_probe(items, tokenizer, "fancy")


def test_atomic_writes_leave_no_temp_files_and_normal_permissions(tmp_path) -> None:
    import os

    import pandas as pd

    from cdscope.io import read_parquet, write_parquet

    target = tmp_path / "x.parquet"
    write_parquet(pd.DataFrame({"a": [1, 2]}), target, {"k": "v"})
    frame, meta = read_parquet(target)
    assert meta == {"k": "v"} and frame["a"].tolist() == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["x.parquet"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
