"""Contamination audit: does an evaluation item also occur in the training or probe data?

Every evaluation item is compared with every reference item (training tasks, probe
pools) on the prompt text, under four criteria:

- exact: the prompt strings are identical;
- normalised: equal after lower-casing and dropping every character outside [0-9a-z]
  (catches whitespace, punctuation and case edits; compared through a hash table);
- near-duplicate: Jaccard similarity of the sets of word 8-grams (words = runs of
  ``\\w`` in the lower-cased text; a text shorter than 8 words is one gram of all its
  words) at >= 0.5 and >= 0.8. An inverted index maps each 8-gram hash to the
  reference items containing it, so only pairs sharing a gram are ever scored —
  J(A, B) = |A ∩ B| / (|A| + |B| - |A ∩ B|) with the intersection counted from the
  postings, never by comparing all pairs;
- code tests: the set of ``assert`` lines of the item's test program, each with all
  whitespace removed and single quotes turned into double quotes; two items match when
  their non-empty sets are equal.

The audit returns one row per (evaluation benchmark, reference set) with the number of
evaluation items flagged by each criterion and the largest Jaccard seen with its pair.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

NGRAM = 8
THRESHOLDS = (0.5, 0.8)
_WORD = re.compile(r"\w+")
_NON_ALNUM = re.compile(r"[^0-9a-z]+")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class AuditItem:
    """What the audit compares: an id, its group (benchmark), prompt text, test asserts."""

    id: str
    group: str
    text: str
    asserts: frozenset[str] = frozenset()


def benchmark_of(task_id: str, family: str, meta: Mapping | None = None) -> str:
    """A task's benchmark: ``family/generator`` from meta, else the id's first two parts.

    ``math/gsm_symbolic/eval/3`` -> ``math/gsm_symbolic``; ``code/HumanEval/42`` ->
    ``code/HumanEval``; an id without '/' falls back to the family alone.
    """
    if meta and isinstance(meta.get("generator"), str):
        return f"{family}/{meta['generator']}"
    parts = task_id.split("/")
    return "/".join(parts[:2]) if len(parts) >= 3 else family


def normalise(text: str) -> str:
    """Lower-case, keep only [0-9a-z]."""
    return _NON_ALNUM.sub("", text.lower())


def ngrams(text: str, n: int = NGRAM) -> frozenset[int]:
    """Hashes of the word n-grams of ``text`` (one gram of all words when shorter than n)."""
    words = _WORD.findall(text.lower())
    if len(words) < n:
        return frozenset([hash(tuple(words))]) if words else frozenset()
    return frozenset(hash(tuple(words[i : i + n])) for i in range(len(words) - n + 1))


def assert_set(tests: str | None) -> frozenset[str]:
    """Normalised ``assert`` lines of a test program (whitespace removed, ' -> ")."""
    if not tests:
        return frozenset()
    lines = (line.strip() for line in tests.splitlines())
    return frozenset(
        _SPACE.sub("", line).replace("'", '"') for line in lines if line.startswith("assert")
    )


def items_from_tasks(tasks: Iterable) -> list[AuditItem]:
    """AuditItems of ``cdscope.tasks.Task`` records (group = benchmark)."""
    return [
        AuditItem(t.id, benchmark_of(t.id, t.family, t.meta), t.prompt, assert_set(t.tests))
        for t in tasks
    ]


def items_from_pool(pool: object) -> list[AuditItem]:
    """AuditItems of a probe pool (``cdscope.core.probes.ProbePool``); code probes keep the
    ``tests`` program they were verified with (an extra key), so their asserts are compared."""
    return [
        AuditItem(
            item.id,
            benchmark_of(item.id, item.family),
            item.prompt,
            assert_set(item.extra.get("tests")),
        )
        for group in pool.by_family.values()  # type: ignore[attr-defined]
        for item in group
    ]


class ReferenceIndex:
    """Hash tables and the 8-gram inverted index over one reference set."""

    def __init__(self, items: Sequence[AuditItem], n: int = NGRAM) -> None:
        self.items = list(items)
        self.n = n
        self.exact: dict[str, int] = {}
        self.normal: dict[str, int] = {}
        self.asserts: dict[frozenset[str], int] = {}
        self.sizes: list[int] = []
        self.postings: dict[int, list[int]] = defaultdict(list)
        for j, item in enumerate(self.items):
            self.exact.setdefault(item.text, j)
            self.normal.setdefault(normalise(item.text), j)
            if item.asserts:
                self.asserts.setdefault(item.asserts, j)
            grams = ngrams(item.text, n)
            self.sizes.append(len(grams))
            for gram in grams:
                self.postings[gram].append(j)

    def best_jaccard(self, text: str) -> tuple[float, int]:
        """Largest word-n-gram Jaccard of ``text`` with any reference item, and its index."""
        grams = ngrams(text, self.n)
        shared: Counter[int] = Counter()
        for gram in grams:
            shared.update(self.postings.get(gram, ()))
        best, where = 0.0, -1
        for j, inter in shared.items():
            score = inter / (len(grams) + self.sizes[j] - inter)
            if score > best or (score == best and where >= 0 and j < where):
                best, where = score, j
        return best, where


def audit(
    evaluation: Sequence[AuditItem],
    references: Mapping[str, Sequence[AuditItem]],
    thresholds: Sequence[float] = THRESHOLDS,
    n: int = NGRAM,
) -> pd.DataFrame:
    """One row per (evaluation group, reference set): counts of flagged evaluation items
    per criterion and the largest Jaccard with its (eval id, reference id) pair."""
    rows = []
    groups: dict[str, list[AuditItem]] = defaultdict(list)
    for item in evaluation:
        groups[item.group].append(item)
    for name, items in references.items():
        index = ReferenceIndex(items, n)
        for group in sorted(groups):
            row: dict = dict(benchmark=group, against=name, items=len(groups[group]))
            row.update(exact=0, normalised=0, **{f"jaccard>={t:g}": 0 for t in thresholds})
            row.update(code_items=0, same_asserts=0, max_jaccard=0.0, max_pair="")
            for item in groups[group]:
                row["exact"] += item.text in index.exact
                row["normalised"] += normalise(item.text) in index.normal
                score, j = index.best_jaccard(item.text)
                for t in thresholds:
                    row[f"jaccard>={t:g}"] += score >= t
                if j >= 0 and score > row["max_jaccard"]:
                    row["max_jaccard"] = score
                    row["max_pair"] = f"{item.id} ~ {index.items[j].id}"
                if item.asserts:
                    row["code_items"] += 1
                    row["same_asserts"] += item.asserts in index.asserts
            rows.append(row)
    return pd.DataFrame(rows)


def reference_sets(
    train_paths: Sequence[str | Path] | None = None,
    probe_paths: Sequence[str | Path] | None = None,
) -> dict:
    """The audit's reference sets: train tasks and probe pools, the shipped ones by default."""
    from cdscope.core.probes import load_pool
    from cdscope.tasks.io.format import default_task_paths, load_tasks

    train = load_tasks(list(train_paths) if train_paths else default_task_paths("train"))
    pool = load_pool(list(probe_paths) if probe_paths else None)
    return {"train": items_from_tasks(train), "probes": items_from_pool(pool)}
