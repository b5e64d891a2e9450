"""The verifier corpus on every shipped task (``cdscope.tasks.judging.corpus``): the reference
answer in at least ten formats passes; wrong, hedged and copy-the-prompt answers fail.

On the previous verifier, 880 of 1,584 correct (task x format) math cases across nine
formats scored 0, every ``\\boxed{\\text{Yes}}`` failed, a fenced program with imports
and a helper failed on 100 of 100 code tasks, and the prompt's own unreduced fraction
passed all 44 simplification tasks. The full code corpus runs in
``benchmarks/bench_verifiers.py``; here every code task gets the chat-style program and
one other format (rotating through all of them), and five tasks get the wrong ones.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from cdscope.tasks import default_task_paths, load_tasks, verify, verify_many
from cdscope.tasks.judging.corpus import cases
from cdscope.tasks.sandbox import code_sandbox_available

CANONICAL = Path(__file__).resolve().parents[1] / "data" / "humaneval_canonical.json"
CHAT = "right:chat program with imports and helpers"


def _shipped(family: str) -> list:
    paths = [p for s in ("train", "eval") for p in default_task_paths(s) if p.stem == family]
    return load_tasks(paths)


def _mistakes(pairs) -> list[tuple[str, str, str, str]]:
    return [
        (c.task.id, c.label, c.completion[-80:], v.message)
        for c, v in pairs
        if v.passed is not c.should_pass
    ]


@pytest.mark.parametrize("family", ["math", "logic"])
def test_every_shipped_answer_task_scores_its_corpus(family: str) -> None:
    tasks = _shipped(family)
    assert len(tasks) == 176
    corpus = [case for task in tasks for case in cases(task)]
    right = Counter(c.task.id for c in corpus if c.should_pass)
    assert min(right.values()) >= 10  # at least ten right formats per task
    kinds = Counter(c.label.split(":")[0] for c in corpus)
    assert kinds["wrong"] and kinds["hedge"] and kinds["copy"], kinds
    verdicts = [verify(c.task, c.completion) for c in corpus]
    assert _mistakes(zip(corpus, verdicts, strict=True)) == []


def test_the_simplify_hack_scores_zero_on_every_fraction_task() -> None:
    """The prompt's own unreduced fraction, in every spelling: 0 on all 44 tasks (it
    scored 1 as \\frac, \\dfrac, (a)/(b) and 'a/b exactly' before)."""
    tasks = [t for t in _shipped("math") if t.meta.get("generator") == "fraction_simplification"]
    assert len(tasks) == 44
    copies = [c for t in tasks for c in cases(t) if c.label.startswith("copy:")]
    assert Counter(c.label for c in copies) == {
        f"copy:{k}": 44 for k in ("frac", "dfrac", "parenthesised", "exactly", "plain")
    }
    assert not any(verify(c.task, c.completion).passed for c in copies)


def _canonical() -> dict[str, str]:
    return json.loads(CANONICAL.read_text(encoding="utf-8"))


@pytest.mark.skipif(not code_sandbox_available()[0], reason="no files-isolating sandbox")
def test_code_corpus_on_shipped_tasks() -> None:
    """Every shipped code task passes a chat-style fenced program with imports, a helper
    and demo code (it scored 0 on all 100 before) and one more right format; wrong,
    copied and prose-only answers fail on five tasks."""
    canonical = _canonical()
    tasks = _shipped("code")
    assert len(tasks) == 100
    chosen = []
    for index, task in enumerate(tasks):
        table = cases(task, canonical[task.meta["task_id"]])
        assert sum(c.should_pass for c in table) >= 10
        # the body alone is test_shipped_canonical_solutions_pass's format
        right = [c for c in table if c.should_pass and c.label not in (CHAT, "right:body")]
        chosen += [c for c in table if c.label == CHAT] + [right[index % len(right)]]
        if index % 20 == 0:
            chosen += [c for c in table if not c.should_pass]
    verdicts = verify_many([c.task for c in chosen], [c.completion for c in chosen], workers=2)
    assert sum(c.label == CHAT for c in chosen) == 100
    assert len({c.label for c in chosen if c.should_pass}) >= 10
    assert _mistakes(zip(chosen, verdicts, strict=True)) == []
