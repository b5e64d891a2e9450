"""The fixed train / audit split of probe pools (issue 35, part 3; docs/probes.md)."""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter

import pytest

from cdscope.core.probes import (
    TRAINING_PROBE_FILE,
    draw_probe,
    load_pool,
    read_training_probe,
    split_pool,
    write_training_probe,
)
from cdscope.errors import CdscopeError
from cdscope.io import read_parquet
from tests.helpers import invoke, refused, write_pool

#: sha256 of the shipped pools' audit-half ids (sorted, one per line), first 16 hex digits:
#: the split is fixed; a change to the rule or the pools that moves an item fails here
SHIPPED_AUDIT_DIGEST = "0bfc8f8a11bc8e1a"


def _ids(pool) -> set[str]:  # noqa: ANN001
    return {item.id for items in pool.by_family.values() for item in items}


def test_shipped_pools_split_in_halves_per_family_and_generator() -> None:
    pool = load_pool()
    train, audit = split_pool(pool, "train"), split_pool(pool, "audit")
    assert _ids(train).isdisjoint(_ids(audit)) and _ids(train) | _ids(audit) == _ids(pool)
    for family in pool.families:
        assert len(train.by_family[family]) == len(audit.by_family[family]) == 32
        for half in (train, audit):  # every generator is split too: 8 of its 16 items each
            strata = Counter(item.id.rpartition("/")[0] for item in half.by_family[family])
            assert set(strata.values()) == {len(half.by_family[family]) // len(strata)}
    digest = hashlib.sha256("\n".join(sorted(_ids(audit))).encode()).hexdigest()[:16]
    assert digest == SHIPPED_AUDIT_DIGEST
    # each half is large enough for n = 3 over 8 seeds, and the halves' draws never meet
    for seed in range(8):
        drawn_train = {i.id for i in draw_probe(train, seed, 3)}
        drawn_audit = {i.id for i in draw_probe(audit, seed, 3)}
        assert len(drawn_train) == len(drawn_audit) == 9 and drawn_train.isdisjoint(drawn_audit)
    assert (train.split, audit.split, pool.split) == ("train", "audit", "all")
    assert len({train.hash, audit.hash, pool.hash}) == 3


def test_the_split_depends_on_item_ids_alone(tmp_path) -> None:
    path = write_pool(tmp_path / "a.jsonl", {"math": 7, "code": 6, "logic": 5})
    lines = path.read_text().splitlines()
    random.Random(0).shuffle(lines)
    shuffled = tmp_path / "b.jsonl"
    shuffled.write_text("\n".join(lines) + "\n")
    edited = tmp_path / "c.jsonl"  # other prompts and targets, the same ids
    edited.write_text(
        "".join(
            json.dumps({**json.loads(line), "prompt": "other?", "target": " 1"}) + "\n"
            for line in lines
        )
    )
    halves = [_ids(split_pool(load_pool([p]), "audit")) for p in (path, shuffled, edited)]
    assert halves[0] == halves[1] == halves[2]
    sizes = Counter(i.split("/")[0] for i in halves[0])
    assert sizes == {"math": 3, "code": 3, "logic": 2}  # odd counts: the train half gets one more


def test_split_refusals(tmp_path) -> None:
    pool = load_pool([write_pool(tmp_path / "p.jsonl", {"math": 3, "code": 1})])
    assert split_pool(pool, "all") is pool
    with pytest.raises(CdscopeError, match="--probe-split must be one of train | audit | all"):
        split_pool(pool, "test")
    with pytest.raises(
        CdscopeError, match="family 'code' has 1 probe item.*none in the audit half"
    ):
        split_pool(pool, "audit")
    train = split_pool(pool, "train")
    assert split_pool(train, "train") is train
    with pytest.raises(CdscopeError, match="the train half of a probe pool has no audit half"):
        split_pool(train, "audit")


def test_training_probe_record_round_trips_and_tolerates_junk(tmp_path) -> None:
    record = {"training_probe_items": ["math/00", "code/01"], "regularizer": "cdrft"}
    write_training_probe(tmp_path, record)
    assert read_training_probe(tmp_path) == record
    assert read_training_probe(tmp_path / "absent") is None
    for junk in ("{", '{"training_probe_items": 3}', "[]", '{"other": []}'):
        (tmp_path / TRAINING_PROBE_FILE).write_text(junk)
        assert read_training_probe(tmp_path) is None


def test_probe_command_draws_from_the_chosen_half(tiny_model_dir, tmp_path) -> None:
    pool_file = write_pool(tmp_path / "pool.jsonl", {"math": 6, "code": 6})
    audit_ids = _ids(split_pool(load_pool([pool_file]), "audit"))
    out = tmp_path / "p.parquet"
    result = invoke("probe", "-m", tiny_model_dir, "--probe", pool_file, "--n", 2, "--seeds", 3,
                    "--probe-split", "audit", "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    metadata = read_parquet(out)[1]
    drawn = {i for seed in metadata["drawn"].values() for ids in seed.values() for i in ids}
    assert drawn <= audit_ids and metadata["settings"]["probe_split"] == "audit"
    assert metadata["probe_hash"] == split_pool(load_pool([pool_file]), "audit").hash
    refused(invoke("probe", "-m", tiny_model_dir, "--probe", pool_file, "--probe-split", "half",
                   "--out", tmp_path / "q.parquet"), "--probe-split")  # fmt: skip


def test_audits_default_to_the_whole_pool_and_refuse_the_split_with_from(
    tiny_model_dir, tmp_path
) -> None:
    pool_file = write_pool(tmp_path / "pool.jsonl", {"math": 6, "code": 6})
    out = tmp_path / "b.parquet"
    result = invoke("bshared", "-m", tiny_model_dir, "--probe", pool_file, "--n", 2, "--seeds", 1,
                    "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    probe_meta = read_parquet(tmp_path / "b.probe.parquet")[1]
    assert "probe_split" not in probe_meta["settings"]  # 'all': the numbers of before the split
    assert probe_meta["probe_hash"] == load_pool([pool_file]).hash
    refused(invoke("bshared", "--from", tmp_path / "b.probe.parquet", "--probe-split", "audit",
                   "--out", tmp_path / "c.parquet"), "--probe-split does not apply")  # fmt: skip
