"""Answers judged for their value and their form (issue #38, Build 3). Each case scored the
other way on the previous verifier, as its docstring says; the corpus cases that cover
the listed false negatives and hedges on every shipped task are checked here too."""

from __future__ import annotations

from collections import Counter

import pytest

from cdscope.tasks import Task, verify, verify_many
from cdscope.tasks.judging import cases
from cdscope.tasks.judging.numeric import read_number
from cdscope.tasks.sandbox import code_sandbox_available
from tests.tasks.routes import shipped


def _math(answer: str, prompt: str = "q") -> Task:
    return Task("t/math", "math", prompt, "math", answer=answer)


@pytest.mark.parametrize(
    ("reference", "leading", "right"),
    [
        ("2\\pi", "2", "\\pi \\cdot 2"),
        ("3+\\pi", "3", "\\pi + 3"),
        ("5i", "5", "5i"),
        ("4x", "4", "4x"),
        ("\\frac{1}{2}\\pi", "\\frac{1}{2}", "\\frac{\\pi}{2}"),
    ],
)
def test_a_reference_that_is_no_plain_number_is_not_its_leading_number(
    reference: str, leading: str, right: str
) -> None:
    """N6: the reference was read as its leading number, so ``\\boxed{2}`` passed for 2π
    and ``\\frac{\\pi}{2}`` failed for ``\\frac{1}{2}\\pi`` (the opposite of docs/tasks.md)."""
    assert read_number(reference) is None
    assert not verify(_math(reference), f"\\boxed{{{leading}}}").passed
    assert verify(_math(reference), f"\\boxed{{{right}}}").passed
    assert verify(_math(reference), f"\\boxed{{{reference}}}").passed


def test_pi_over_two_in_every_spelling() -> None:
    task = _math("\\frac{1}{2}\\pi")
    for spelling in ("\\frac{\\pi}{2}", "\\pi/2", "\\frac12\\pi"):
        assert verify(task, f"\\boxed{{{spelling}}}").passed, spelling


# (prompt, reference, the question's own expression, the reference in another spelling)
TRANSFORMS = [
    ("Simplify $\\sqrt{245}$.", "7\\sqrt{5}", "\\sqrt{245}", "\\sqrt{5} \\cdot 7"),
    ("Simplify $\\sqrt{8}$.", "2\\sqrt{2}", "\\sqrt{8}", "2 \\sqrt 2"),
    ("Expand $(x+1)^2$.", "x^2+2x+1", "(x+1)^2", "1 + 2x + x^2"),
    ("Expand the product $x(x+2)$.", "x^2+2x", "x(x+2)", "2x + x^2"),
    ("Factor $x^2-1$.", "(x-1)(x+1)", "x^2-1", "(x+1)(x-1)"),
    ("Factor $x^2+5x+6$.", "(x+2)(x+3)", "x^2+5x+6", "(x+3)(x+2)"),
    ("Rationalize the denominator of $\\frac{1}{\\sqrt{2}}$.", "\\frac{\\sqrt{2}}{2}",
     "\\frac{1}{\\sqrt{2}}", "\\frac{1}{2}\\sqrt{2}"),
    ("Compute $\\sqrt{54}\\cdot\\sqrt{32}\\cdot\\sqrt{6}$.", "72\\sqrt{2}",
     "\\sqrt{54}\\cdot\\sqrt{32}\\cdot\\sqrt{6}", "72 \\sqrt{2}"),
]  # fmt: skip


@pytest.mark.parametrize(("prompt", "reference", "restated", "spelled"), TRANSFORMS)
def test_restating_the_question_does_not_answer_a_transform_task(
    prompt: str, reference: str, restated: str, spelled: str
) -> None:
    """N7: math-verify evaluates the candidate, so the question's own expression passed
    (7 of 8 such items in the issue): the one hack a policy could learn with no effort.
    The form rule: no mark of an unfinished transformation the reference does not show."""
    task = _math(reference, prompt)
    restating = verify(task, f"\\boxed{{{restated}}}")
    assert not restating.passed and "not in the reference's form" in restating.message
    assert verify(task, f"\\boxed{{{spelled}}}").passed
    assert verify(task, f"The answer is ${reference}$.").passed


def test_the_form_rule_is_for_transform_tasks_only() -> None:
    """Where the prompt asks for no transformation, any equal value passes as before."""
    assert verify(_math("2\\sqrt{3}"), "\\boxed{\\sqrt{12}}").passed
    assert verify(_math("x^2+2x+1", "Find p(x)."), "\\boxed{(x+1)^2}").passed


@pytest.mark.parametrize(
    ("reference", "candidate", "passed"),
    [
        ("(1,2)", "\\{1,2\\}", False),
        ("\\{1,2\\}", "(1,2)", False),
        ("\\{1,2\\}", "[1,2]", False),
        ("(1,2,3)", "\\{1,2,3\\}", False),
        ("(1,2)", "(1, 2)", True),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("[0,1)", "[0, 1)", True),
    ],
)
def test_pairs_sets_and_intervals_are_kept_apart(
    reference: str, candidate: str, passed: bool
) -> None:
    """N8: ``(1,2)`` and ``\\{1,2\\}`` were judged equal in both directions."""
    verdict = verify(_math(reference), f"\\boxed{{{candidate}}}")
    assert verdict.passed is passed, verdict.message


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{42\\pi}",
        "Answer: 42 minus one",
        "\\boxed{42 or so}",
        "\\boxed{42x}",
        "\\boxed{42 = 43}",
    ],
)
def test_a_wrong_tail_is_no_number(completion: str) -> None:
    """Hedges and wrong tails that passed for 42: the number and then more mathematics."""
    assert not verify(_math("42"), completion).passed


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{42 apples}", "\\boxed{42 \\text{ cm}}", "Answer: 42 km/h", "\\boxed{42^\\circ}",
        "\\boxed{42°}", "\\boxed{x = 42}", "\\boxed{6 \\times 7 = 42}", "**Final Answer**\n 42",
        "\\boxed{{42}}", "\\boxed{42}\n\n\\boxed{}", "\\boxed{42} \\quad \\blacksquare \\boxed{QED}",
    ],
)  # fmt: skip
def test_units_and_natural_spellings_still_pass(completion: str) -> None:
    assert verify(_math("42"), completion).passed


# the corpus labels of issue 38 and the shipped tasks each must be found on
SPELLINGS = {
    "math": {
        "right:heading": 176, "right:double braces": 176, "right:empty box after": 176,
        "right:tick box after": 176, "right:degrees": 117, "right:left right": 44,
        "right:cfrac": 44, "right:equation": 44, "hedge:pi tail": 176, "hedge:minus one": 176,
    },
    "logic": {
        "right:heading": 176, "right:caps": 44, "right:labelled": 44, "right:one per line": 44,
        "right:negated": 44, "right:in words": 44, "right:because": 44,
        "hedge:or in parentheses": 44, "hedge:conditional": 88,
    },
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(SPELLINGS))
def test_each_listed_false_negative_scores_one_and_each_hedge_zero(family: str) -> None:
    """The false negatives of the issue scored 1 on 0 of the tasks each, the hedges 1 on
    all (``**Final Answer**\\n r``, ``\\boxed{{r}}``, a trailing empty or tick box, ``^\\circ``,
    ``\\left(\\frac{p}{q}\\right)``, ``a/b = p/q``, ``\\cfrac``; knights in capitals, ``X: R``,
    ``X is not a knave``, one name a line; "It does not follow", "No, because ..."; ``42\\pi``,
    ``42 minus one``, ``knight (or knave)``, conditionals). Now on every shipped task."""
    tasks = [t for kind in ("math", "logic", "logic:knights_knaves", "logic:syllogism",
                            "logic:number_sorting", "logic:shortest_path") for t in shipped(kind)
             if t.family == family]  # fmt: skip
    table = [c for t in tasks for c in cases(t) if c.label in SPELLINGS[family]]
    assert Counter(c.label for c in table) == SPELLINGS[family]
    verdicts = verify_many([c.task for c in table], [c.completion for c in table])
    wrong = [(c.task.id, c.label, v.message) for c, v in zip(table, verdicts, strict=True)
             if v.passed is not c.should_pass]  # fmt: skip
    assert wrong == []


@pytest.mark.skipif(not code_sandbox_available()[0], reason="no code sandbox")
def test_code_with_a_helper_in_an_earlier_block_or_a_table_a_loop_fills_passes() -> None:
    """Code: a helper shown in an earlier fenced block, and a module-level loop that fills
    a table the function reads, scored 0 on every task (the last defining block alone was
    kept; the sanitizer dropped every loop). Every tenth shipped code task here; the
    benchmark runs all 100."""
    import json
    from pathlib import Path

    canonical = json.loads(
        (Path(__file__).resolve().parents[1] / "data" / "humaneval_canonical.json").read_text()
    )
    labels = ("right:helper in an earlier block", "right:table filled by a loop")
    tasks = shipped("code")[::10]
    table = [c for t in tasks for c in cases(t, canonical[t.meta["task_id"]]) if c.label in labels]
    assert len(table) == 2 * len(tasks) == 20
    verdicts = verify_many([c.task for c in table], [c.completion for c in table])
    assert [v.message for v in verdicts] == ["ok"] * 20
