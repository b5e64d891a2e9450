"""Property: whatever text a policy writes, every route to a reward returns one verdict per
completion, within its deadline (issue #38, Build 1).

Hypothesis draws completions from random text and from hostile fragments repeated up to
thousands of times (runs of spaces, 310-digit numbers, separators, unclosed boxes and
fences, knights names, hedge words, ``10^{10^{10}}``, programs that loop or exit), and
throws them at every verifier kind through ``verify``, ``verify_many``,
``train.run.verifier_rewards`` and the TRL reward. Bounded for ``make test``: about 20 s
for the answer kinds and 25 s for the code kinds on 2 loaded cores.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdscope.tasks import Task, verify_many
from cdscope.tasks.sandbox import code_sandbox_available
from tests.tasks.routes import ADD, ANSWER_TASKS, rewards_by_route

TIMEOUT = 1.0
START = 2.5  # a math-verify worker's start (0.7-1.2 s measured): outside the deadline
PROGRAM = Task(
    "p/double",
    "code",
    "Write a function double(n) that returns twice n.",
    "code:program",
    tests="def check(candidate):\n    assert candidate(2) == 4\n",
    entry_point="double",
)
FRAGMENTS = [
    " ", "\n", "\t", "1", "9" * 310, "1,000", "{,}", "\\,", "\\!", "0.5", "-", "/", "^",
    "\\boxed{", "\\fbox{", "{", "}", "\\frac{", "\\sqrt{", "10^{10^{10}}", "\\pi", "\\{", "\\}",
    "$", "\\(", "\\)", "Answer:", "The answer is ", "Final answer:", "**Final Answer**\n",
    "####", "I hope it is correct.", "Jack", "Abigail", " is a knight", " is a knave",
    " is not a ", "a-", ": ", " or ", " if ", "because ", "Yes", "No", "It does not follow",
    "up ", "down ", "right ", "infeasible", "[", "]", "'", ", ", "```python\n", "```",
    "def double(n):\n", "def add(a, b):\n", "    return a + b\n", "    return n * 2\n",
    "    while True:\n        pass\n", "    import os\n    os._exit(0)\n", "é", "\U0001f600",
    "\x00", "\\",
]  # fmt: skip
HOSTILE = st.lists(
    st.tuples(st.sampled_from(FRAGMENTS), st.integers(1, 400)), min_size=1, max_size=6
).map(lambda parts: "".join(fragment * times for fragment, times in parts))
COMPLETIONS = st.one_of(st.text(max_size=400), HOSTILE)
BOUNDED = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)  # and max_examples: each example is a batch through four routes


def _assert_verdicts(tasks: list[Task], completions: list[str], timeout: float = TIMEOUT) -> None:
    """Each verdict within its deadline (+1 s, and a worker start for a symbolic
    comparison), then one verdict per completion on every route."""
    for task, verdict in zip(tasks, verify_many(tasks, completions, timeout=timeout), strict=True):
        allowed = timeout + 1.0 + (START if task.id == "p/root" else 0.0)
        assert verdict.seconds <= allowed, (task.id, verdict)
    for route, rewards in rewards_by_route(tasks, completions, timeout=timeout).items():
        assert len(rewards) == len(completions), route
        assert all(r in (0.0, 1.0) for r in rewards), route


@settings(BOUNDED, max_examples=40)
@given(st.lists(COMPLETIONS, min_size=len(ANSWER_TASKS), max_size=len(ANSWER_TASKS)))
def test_every_answer_kind_returns_a_verdict_per_completion_in_time(completions) -> None:
    _assert_verdicts(ANSWER_TASKS, completions)


@pytest.mark.skipif(not code_sandbox_available()[0], reason="no code sandbox")
@settings(BOUNDED, max_examples=8)
@given(st.lists(COMPLETIONS, min_size=2, max_size=2))
def test_every_code_kind_returns_a_verdict_per_completion_in_time(completions) -> None:
    _assert_verdicts([ADD, PROGRAM], completions)


def test_the_property_can_fail(monkeypatch) -> None:
    """The bound is one a slow verdict breaks: a plugin that sleeps past it."""
    from cdscope.tasks.judging import registry

    monkeypatch.setitem(
        registry.VERIFIERS, "p-slow", lambda t, c, *, timeout: time.sleep(1.2) or True
    )
    slow = Task("p/slow", "logic", "q", "p-slow", answer="x")
    with pytest.raises(AssertionError):
        _assert_verdicts([slow], ["x"], timeout=0.05)
