"""A reward step that cannot fail (issue #38, Build 1): whatever one completion holds, every
route to a reward returns one per completion; an exception while judging scores that
completion 0 with its reason and never reaches the batch. Each defect below raised out
of the reward step on the previous verifier, as its test says."""

from __future__ import annotations

import ast
import re
import threading
import time

import pytest

from cdscope.errors import CdscopeError
from cdscope.tasks import Task, register_verifier, verify, verify_many
from cdscope.tasks.judging import registry
from cdscope.tasks.sandbox import code_sandbox_available
from tests.tasks.routes import ADD, rewards_by_route, shipped

needs_sandbox = pytest.mark.skipif(not code_sandbox_available()[0], reason="no code sandbox")


def _first_number_replaced(answer: str, digits: str) -> str:
    return re.sub(r"-?\d+(?:\.\d+)?", digits, answer, count=1)


@pytest.mark.parametrize("curriculum", [False, True])
def test_a_310_digit_first_number_scores_zero_on_every_sorting_task(curriculum: bool) -> None:
    """N1: ``float()`` of the wrong 310-digit number in the message raised OverflowError
    from every route, on 44/44 shipped and 44/44 curriculum sorting tasks (329 tokens,
    under the default 512)."""
    tasks = shipped("logic:number_sorting", curriculum=curriculum)
    assert len(tasks) == 44
    completions = [f"Answer: {_first_number_replaced(t.answer or '', '9' * 310)}" for t in tasks]
    for route, rewards in rewards_by_route(tasks, completions).items():
        assert rewards == [0.0] * len(tasks), route
    assert "position 1: expected" in verify(tasks[0], completions[0]).message


SEPARATED = {
    "comma": "1" + ",000" * 1500,
    "latex comma": "1" + "{,}000" * 1500,
    "thin space": "1" + "\\,000" * 1500,
    "negative space": "1" + "\\!000" * 1500,
}


@pytest.mark.parametrize("spelling", sorted(SEPARATED))
def test_a_4500_digit_number_with_separators_scores_zero_on_every_math_task(spelling: str) -> None:
    """N2: the digits of ``1,000,…`` were counted run by run (3 at a time), then joined and
    passed to ``Fraction``: ValueError (Python's 4,300-digit limit) on 176/176 math tasks."""
    tasks = shipped("math")
    assert len(tasks) == 176
    completions = [f"\\boxed{{{SEPARATED[spelling]}}}"] * len(tasks)
    for route, rewards in rewards_by_route(tasks, completions).items():
        assert rewards == [0.0] * len(tasks), route
    assert "over 1000 digits" in verify(tasks[0], completions[0]).message


def test_an_exception_inside_one_verdict_scores_that_completion_zero(monkeypatch) -> None:
    """A verifier that raises on one completion: that completion gets 0 and the reason, the
    others their verdicts, on every route (the batch raised before)."""

    def fragile(task: Task, completion: str, *, timeout: float) -> bool:
        if "boom" in completion:
            raise RecursionError("maximum recursion depth exceeded")
        return completion.strip() == task.answer

    monkeypatch.setitem(registry.VERIFIERS, "test-fragile", None)  # removed afterwards
    register_verifier("test-fragile", fragile, replace=True)
    task = Task("t/fragile", "logic", "q", "test-fragile", answer="42")
    completions = ["42", "boom", "41", "42"]
    for route, rewards in rewards_by_route([task] * 4, completions).items():
        assert rewards == [1.0, 0.0, 0.0, 1.0], route
    crashed = verify_many([task] * 4, completions)[1]
    assert crashed.crashed and not verify(task, "41").crashed
    assert crashed.message == "verifier error: RecursionError: maximum recursion depth exceeded"


def test_errors_of_the_task_itself_still_refuse() -> None:
    """A task without its answer is the task file's error (it would score every completion
    0): a one-line CdscopeError, as before, not a silent 0."""
    with pytest.raises(CdscopeError, match="needs an 'answer'"):
        verify_many([Task("t/none", "math", "q", "math")], ["\\boxed{1}"])


def test_a_completion_that_is_not_text_or_is_huge_scores_zero() -> None:
    task = Task("t/m", "math", "q", "math", answer="1")
    assert verify(task, None).message == "the completion is a NoneType, not text"  # type: ignore[arg-type]
    huge = verify(task, "\\boxed{1}" + " " * 1_000_000)
    assert not huge.passed and "read up to 1,000,000" in huge.message


def test_every_verdict_says_how_long_it_took() -> None:
    task = Task("t/m", "math", "q", "math", answer="1")
    verdict = verify(task, "\\boxed{1}")
    assert 0 < verdict.seconds < 1.0
    assert verdict == type(verdict)(True, "ok")  # seconds is no part of its identity


@needs_sandbox
def test_code_parses_never_overlap_across_verify_many_threads(monkeypatch) -> None:
    """N3: two of verify_many's threads in ``ast.parse`` at once raised ``SystemError: AST
    constructor recursion depth mismatch`` on honest code (CPython 3.11, 3 times in ~60
    batches of 100). A probe that widens each parse to 50 ms saw two at once before."""
    real = ast.parse
    inside, most, lock = [0], [0], threading.Lock()

    def probe(source, *args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.05)
            return real(source, *args, **kwargs)
        finally:
            with lock:
                inside[0] -= 1

    monkeypatch.setattr(ast, "parse", probe)
    fenced = "```python\ndef add(a, b):\n    return a + b\n```\n"
    verdicts = verify_many([ADD] * 6, [fenced] * 6, workers=3)
    assert [v.passed for v in verdicts] == [True] * 6
    assert most[0] == 1


@needs_sandbox
def test_a_spurious_parser_system_error_is_tried_again(monkeypatch) -> None:
    """The same SystemError from a parse beside a thread outside cdscope: parsed again."""
    real, failed = ast.parse, []

    def flaky(source, *args, **kwargs):
        if not failed:
            failed.append(True)
            raise SystemError("AST constructor recursion depth mismatch (before=90, after=65)")
        return real(source, *args, **kwargs)

    monkeypatch.setattr(ast, "parse", flaky)
    assert verify(ADD, "```python\ndef add(a, b):\n    return a + b\n```\n").passed
    assert failed == [True]


@needs_sandbox
def test_a_program_too_large_to_send_scores_zero() -> None:
    """D4: a program of over 8 MiB of escaped JSON (an emoji is 12 bytes escaped) raised
    ``WireError`` out of the verdict; code completions are now bounded before any parse,
    and a program that still cannot be sent scores 0."""
    completion = "    return a + b\n# " + "\U0001f600" * 700_000 + "\n"
    for route, rewards in rewards_by_route([ADD, ADD], [completion, "    return a + b\n"]).items():
        assert rewards == [0.0, 1.0], route
    assert "characters (over 65,536)" in verify(ADD, completion).message
