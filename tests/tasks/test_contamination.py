"""Contamination audit: planted duplicates found; the inverted index equals an all-pairs twin."""

from __future__ import annotations

import random
import time

import pytest

from cdscope.tasks.io.contamination import (
    AuditItem,
    ReferenceIndex,
    assert_set,
    audit,
    benchmark_of,
    ngrams,
    normalise,
)

WORDS = [f"w{i}" for i in range(400)]


def _text(rng: random.Random, length: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(length))


def jaccard_all_pairs(text: str, refs: list[AuditItem]) -> tuple[float, int]:
    """Slow twin: Jaccard against every reference, with Python sets of word tuples."""

    def grams(t: str) -> set[tuple[str, ...]]:
        w = t.lower().replace(",", " ").split()
        return {tuple(w)} if len(w) < 8 else {tuple(w[i : i + 8]) for i in range(len(w) - 7)}

    a = grams(text)
    best, where = 0.0, -1
    for j, ref in enumerate(refs):
        b = grams(ref.text)
        score = len(a & b) / len(a | b) if a | b else 0.0
        if score > best:
            best, where = score, j
    return best, where


def _planted() -> tuple[list[AuditItem], list[AuditItem]]:
    rng = random.Random(0)
    refs = [AuditItem(f"train/{i}", "train", _text(rng, 60)) for i in range(200)]
    base = refs[7].text.split()
    evals = [
        AuditItem("e/exact", "b1", refs[3].text),
        AuditItem("e/case", "b1", refs[4].text.upper().replace(" ", " , ")),
        # keep the first 50 of 60 words, replace the rest: a known partial overlap
        AuditItem("e/partial", "b2", " ".join(base[:50] + ["zz"] * 10)),
        AuditItem("e/fresh", "b2", _text(random.Random(99), 60).replace("w", "v")),
        AuditItem("e/short", "b2", "w1 w2 w3"),
    ]
    refs.append(AuditItem("train/short", "train", "W1, w2 w3"))
    return evals, refs


def test_inverted_index_equals_all_pairs_jaccard() -> None:
    evals, refs = _planted()
    rng = random.Random(1)
    # many more probes: random splices of reference texts at random cut points
    for i in range(60):
        a, b = rng.sample(refs[:200], 2)
        cut = rng.randrange(5, 55)
        text = " ".join(a.text.split()[:cut] + b.text.split()[cut:])
        evals.append(AuditItem(f"e/splice{i}", "b3", text))
    index = ReferenceIndex(refs)
    for item in evals:
        fast, j = index.best_jaccard(item.text)
        slow, k = jaccard_all_pairs(item.text, refs)
        assert fast == pytest.approx(slow, abs=1e-12), item.id
        if slow > 0:
            assert j == k


def test_planted_duplicates_are_counted_per_criterion() -> None:
    evals, refs = _planted()
    partial, _ = jaccard_all_pairs(evals[2].text, refs)
    assert 0.5 <= partial < 0.8  # (43 shared 8-grams) / (53 + 53 - 43) = 0.683
    out = audit(evals, {"train": refs}).set_index("benchmark")
    assert out.loc["b1", "exact"] == 1 and out.loc["b1", "normalised"] == 2
    assert out.loc["b1", "jaccard>=0.8"] == 2  # ',' and case do not change the words
    assert out.loc["b2", "exact"] == 0 and out.loc["b2", "normalised"] == 1  # e/short
    assert out.loc["b2", "jaccard>=0.5"] == 2 and out.loc["b2", "jaccard>=0.8"] == 1
    assert out.loc["b2", "max_jaccard"] == 1.0
    assert out.loc["b2", "max_pair"] == "e/short ~ train/short"
    assert out.loc["b1", "items"] == 2 and out.loc["b2", "items"] == 3


def test_code_assert_sets_compare_after_normalisation() -> None:
    tests_a = "def check(candidate):\n    assert candidate('a') == 1\n    assert  candidate([1, 2]) == [2]\n"
    tests_b = 'def check(c):\n    assert candidate([1,2]) == [2]\n    assert candidate("a")==1\n'
    tests_c = "def check(candidate):\n    assert candidate('a') == 1\n"
    assert assert_set(tests_a) == assert_set(tests_b) != assert_set(tests_c)
    refs = [AuditItem("t/1", "code", "prompt one", assert_set(tests_b))]
    evals = [
        AuditItem("e/1", "code", "another prompt", assert_set(tests_a)),
        AuditItem("e/2", "code", "third prompt", assert_set(tests_c)),
        AuditItem("e/3", "code", "no tests"),
    ]
    row = audit(evals, {"train": refs}).iloc[0]
    assert row["code_items"] == 2 and row["same_asserts"] == 1


def test_helpers() -> None:
    assert normalise("Hello, World!\n 42") == "helloworld42"
    assert len(ngrams("a b c d e f g h i")) == 2 and len(ngrams("a b")) == 1
    assert ngrams("") == frozenset()
    assert benchmark_of("math/gsm_symbolic/eval/3", "math", {"generator": "gsm_symbolic"}) == (
        "math/gsm_symbolic"
    )
    assert benchmark_of("code/HumanEval/42", "code") == "code/HumanEval"
    assert benchmark_of("q17", "logic") == "logic"


def test_scales_without_comparing_all_pairs() -> None:
    rng = random.Random(3)
    refs = [AuditItem(f"r{i}", "r", _text(rng, 80)) for i in range(5000)]
    evals = [AuditItem(f"e{i}", "e", _text(rng, 80)) for i in range(2000)]
    start = time.perf_counter()
    out = audit(evals, {"train": refs})
    assert time.perf_counter() - start < 20  # all pairs would be 10^7 set comparisons
    assert out.loc[0, "jaccard>=0.5"] == 0


def test_code_probes_are_audited_by_their_test_asserts(tmp_path) -> None:
    """A probe's ``tests`` (an extra key of the pool line) feed the assert comparison."""
    import json

    from cdscope.core.probes import load_pool
    from cdscope.tasks.io.contamination import items_from_pool

    tests = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(0) == 0\n"
    line = {
        "id": "code/p/0",
        "family": "code",
        "prompt": "def double(x):\n",
        "target": "  return 2 * x\n",
    }
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps(line | {"tests": tests}) + "\n")
    (probe,) = items_from_pool(load_pool([path]))
    assert probe.asserts == assert_set(tests) and len(probe.asserts) == 2
    renamed = tests.replace("candidate(2) == 4", "candidate( 2 )==4")  # same set, other text
    evals = [AuditItem("code/e/0", "code/e", "def twice(y):\n", assert_set(renamed))]
    assert audit(evals, {"probes": [probe]}).iloc[0]["same_asserts"] == 1
