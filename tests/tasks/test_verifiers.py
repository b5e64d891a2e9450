"""Verifiers: answer extraction, exact numeric comparison, logic checks, code via the sandbox."""

from __future__ import annotations

import random
import re
from fractions import Fraction
from pathlib import Path

import pytest

from cdscope.core.probes import load_pool
from cdscope.errors import CdscopeError
from cdscope.tasks import Task, task_from_probe_item, verify, verify_many
from cdscope.tasks.judging.answers import find_final_answer
from cdscope.tasks.judging.code import build_program, extract_code
from cdscope.tasks.judging.logic import check_shortest_path
from cdscope.tasks.judging.numeric import parse_number
from cdscope.tasks.sandbox import sandbox_available

ROOT = Path(__file__).resolve().parents[2]
PROBES = ROOT / "cdscope" / "data" / "probes"  # shipped pools (package data)


def math_task(answer: str) -> Task:
    return Task("m/1", "math", "q\nSolution:\n", "math", answer=answer)


# -- final-answer extraction ----------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("so \\boxed{12} and later \\boxed{\\frac{3}{4}}.", "\\frac{3}{4}"),
        ("\\boxed{\\text{{nested} braces}}", "{nested} braces"),
        ("The answer is 5.\nThen again, the answer is: **7**.", "7"),
        ("First answer is 3; \\boxed{4} wins over 'answer is'", "4"),
        ("The Answer Is $-2.5$.\nQuestion: next", "-2.5"),
        ("\\boxed{1 unclosed", None),
        ("no statement at all", None),
        ("The answer is   \n", None),
    ],
)
def test_final_answer_extraction(completion: str, expected: str | None) -> None:
    found = find_final_answer(completion)
    assert (found.text if found else None) == expected


def test_answer_statement_end_cuts_after_its_line() -> None:
    text = "work\nThe answer is 9.\nQuestion: another one"
    found = find_final_answer(text)
    assert text[: found.end] == "work\nThe answer is 9."


# -- numbers: fast parser against an obviously-correct twin ---------------------------
def _renderings(value: Fraction, rng: random.Random) -> list[str]:
    """Ways a model writes ``value`` (all exact)."""
    out = [
        f"{value.numerator}/{value.denominator}",
        f"\\frac{{{value.numerator}}}{{{value.denominator}}}",
    ]
    if value.denominator == 1:
        n = value.numerator
        out += [str(n), f"{n:,}", f"${n}", f"{n} apples", f"{n}.", f"x = {n}", f"**{n}**"]
    scaled = value * 10**4
    if scaled.denominator == 1:  # a terminating decimal with <= 4 places
        sign = "-" if value < 0 else ""
        whole, frac = divmod(abs(scaled.numerator), 10**4)
        out += [f"{sign}{whole}.{frac:04d}", f"{sign}{whole:,}.{frac:04d} cm"]
    return out


def test_parse_number_matches_exact_twin() -> None:
    rng = random.Random(0)
    for _ in range(400):
        den = rng.choice([1, 1, 2, 4, 5, 8, 10, 3, 7, 16, 10000])
        value = Fraction(rng.randint(-(10**7), 10**7), den)
        for text in _renderings(value, rng):
            assert parse_number(text) == value, text


@pytest.mark.parametrize("text", ["12 or 13", "3 1/2", "10^3", "abc", "", "1,2345", "1/0"])
def test_parse_number_refuses_ambiguous_text(text: str) -> None:
    assert parse_number(text) is None


@pytest.mark.parametrize(
    ("answer", "completion", "passed", "message"),
    [
        ("1234", "The answer is 1,234.", True, "ok"),
        ("0.75", "so \\boxed{\\frac{3}{4}}", True, "ok"),
        ("3/4", "The answer is 0.75", True, "ok"),
        ("12", "The answer is 13.", False, "expected 12, got 13"),
        ("12", "I think it is 12", False, "no final answer found"),
        ("12", "The answer is 12 or 13.", False, "expected 12, got non-number '12 or 13'"),
        ("440/797", "The answer is 880/1594.", False, "not in lowest terms"),
        ("440/797", "The answer is 440 / 797.", True, "ok"),
        ("-7", "The answer is −7 dollars.", True, "ok"),
        ("0.1", "The answer is 0.10000000000000001.", False, "expected 0.1"),
    ],
)
def test_math_verifier(answer: str, completion: str, passed: bool, message: str) -> None:
    verdict = verify(math_task(answer), completion)
    assert verdict.passed is passed
    assert message in verdict.message


# -- every probe target passes its own item; a perturbed answer fails ------------------
def _perturb(task: Task, target: str) -> str:
    """The target with a wrong final answer of the same form."""
    body, _, _ = target.rstrip("\n").rpartition("\n")
    answer = task.answer or ""
    kind = task.verifier
    if kind == "math":
        value = parse_number(answer) + 1
        wrong = (
            str(value.numerator)
            if value.denominator == 1
            else f"{value.numerator}/{value.denominator}"
        )
    elif kind == "logic:knights_knaves":
        first_role = re.search(r" is an? (\w+)", answer).group(1)
        roles = set(re.findall(r" is an? (\w+)", task.prompt))
        other = next(iter(roles - {first_role}))
        wrong = re.sub(rf" is an? {first_role}", f" is a {other}", answer, count=1)
    elif kind == "logic:syllogism":
        wrong = "No" if answer == "Yes" else "Yes"
    elif kind == "logic:number_sorting":
        wrong = str(list(reversed(eval(answer))))  # the list literal written by the builder
    elif kind == "logic:shortest_path":
        wrong = "up" if answer == "infeasible" else " ".join(answer.split()[:-1]) or "infeasible"
    else:
        raise AssertionError(kind)
    assert wrong != answer
    return f"{body}\nThe answer is {wrong}."


@pytest.mark.parametrize("family", ["math", "logic"])
def test_probe_targets_pass_and_perturbed_answers_fail(family: str) -> None:
    pool = load_pool([PROBES / f"{family}.jsonl"])
    items = pool.by_family[family]
    assert len(items) == 64
    for item in items:
        task = task_from_probe_item(item)
        good = verify(task, item.target)
        assert good.passed, (item.id, good.message)
        bad = verify(task, _perturb(task, item.target))
        assert not bad.passed, (item.id, _perturb(task, item.target))


def test_logic_checks_are_structural() -> None:
    kk = Task(
        "l/1",
        "logic",
        "q",
        "logic:knights_knaves",
        answer="Luke is an altruist, and Emily is an egoist",
    )
    assert verify(kk, "The answer is Emily is an egoist and Luke is an altruist.").passed
    assert verify(kk, "The answer is emily is an egoist; luke, who is an altruist.").passed is False
    assert verify(kk, "The answer is emily is an egoist; luke is an altruist.").passed
    assert not verify(kk, "The answer is Emily is an egoist.").passed
    assert not verify(kk, "The answer is Luke is an egoist, and Emily is an egoist.").passed
    assert "two roles" in verify(kk, "The answer is Luke is an altruist, Luke is an egoist").message
    syl = Task("l/2", "logic", "q", "logic:syllogism", answer="No")
    assert verify(syl, "The answer is no, it does not follow.").passed
    assert not verify(syl, "The answer is Yes.").passed
    srt = Task("l/3", "logic", "q", "logic:number_sorting", answer="['34.0', '-6.42']")
    assert verify(srt, "The answer is [34, -6.42].").passed
    assert not verify(srt, "The answer is [-6.42, 34].").passed


GRID_PROMPT = """Now, find the shortest path from * to # in the following grid:
* O O
O X O
O O #
Solution:
"""


def test_shortest_path_accepts_any_shortest_path() -> None:
    task = Task("l/4", "logic", GRID_PROMPT, "logic:shortest_path", answer="right right down down")
    assert verify(task, "The answer is down down right right.").passed
    assert verify(task, "The answer is right right down down.").passed
    assert "blocked" in verify(task, "The answer is down right right down.").message
    assert "shortest has 4" in verify(task, "The answer is right right down down up down.").message
    assert not verify(task, "The answer is infeasible.").passed
    # Grid not parseable -> exact match only.
    assert check_shortest_path("up", "up", "no grid here") == (True, "ok")
    assert not check_shortest_path("up", "left", "no grid here")[0]


def test_unknown_kind_and_length_mismatch_are_user_errors() -> None:
    task = Task("x/1", "x", "q", "nope", answer="1")
    with pytest.raises(CdscopeError, match="unknown verifier kind 'nope'"):
        verify(task, "The answer is 1.")
    with pytest.raises(CdscopeError, match="1 tasks but 2 completions"):
        verify_many([math_task("1")], ["a", "b"])


# -- code ------------------------------------------------------------------------------
needs_sandbox = pytest.mark.skipif(not sandbox_available()[0], reason="no sandbox here")


def code_items() -> list:
    return list(load_pool([PROBES / "code.jsonl"]).by_family["code"])


def test_code_extraction_keeps_the_function_and_drops_what_follows() -> None:
    body = "    return a + b\n"
    task = Task(
        "c/1",
        "code",
        "def add(a, b):\n",
        "code",
        tests="def check(f):\n    assert f(1, 2) == 3\n",
        entry_point="add",
    )
    program = "def add(a, b):\n" + body
    assert build_program(task, body + "\ndef unrelated():\n    pass\n") == program
    assert build_program(task, body + "\nprint(add(1, 2))\n") == program
    fenced = "Here:\n```python\ndef add(a, b):\n    return a + b\n```\nDone."
    assert extract_code(fenced, "add") == ("def add(a, b):\n    return a + b\n", True)
    assert build_program(task, fenced) == "def add(a, b):\n    pass\n" + program
    assert build_program(task, body) == program and "check" not in program  # no tests


@needs_sandbox
def test_code_verifier_passes_correct_and_fails_wrong_completions() -> None:
    item = code_items()[0]
    task = task_from_probe_item(item)
    assert verify(task, item.target).passed
    fenced = f"```python\n{item.prompt}{item.target}```\nThis solves it."
    assert verify(task, fenced).passed
    wrong = verify(task, "    return []\n")
    assert not wrong.passed and wrong.message.startswith("AssertionError")
    looping = verify(task, "    while True:\n        pass\n", timeout=1.0)
    assert looping == type(looping)(False, "timeout after 1.0s")
    assert verify(task, "    import os\n    os._exit(0)\n").passed is False


@needs_sandbox
def test_verify_many_equals_one_by_one_and_keeps_order() -> None:
    items = code_items()[:4]
    tasks = [task_from_probe_item(i) for i in items] + [math_task("5"), math_task("6")]
    completions = [items[0].target, "    return None\n", items[2].target, "    pass\n"]
    completions += ["The answer is 5.", "The answer is 5."]
    fast = verify_many(tasks, completions, workers=2)
    slow = [verify(t, c) for t, c in zip(tasks, completions, strict=True)]
    assert (
        [v.passed for v in fast]
        == [v.passed for v in slow]
        == [True, False, True, False, True, False]
    )
    assert fast == slow


def test_shortest_path_check_matches_brute_force_enumeration() -> None:
    """Slow twin: enumerate every walk over open cells; the shortest ones pass, nothing else.

    On grids of at most 9 cells a shortest path has at most 8 moves, so enumerating all
    walks of up to 8 moves that stay on open cells finds the true shortest length."""
    import itertools

    rng = random.Random(1)
    moves = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
    for _ in range(30):
        rows, cols = rng.choice([(2, 3), (3, 3)])
        cells = [rng.choice("OOOX") for _ in range(rows * cols)]
        start, goal = rng.sample(range(rows * cols), 2)
        cells[start], cells[goal] = "*", "#"
        grid = [cells[r * cols : (r + 1) * cols] for r in range(rows)]
        prompt = "in the following grid:\n" + "\n".join(" ".join(r) for r in grid) + "\nSolution:\n"

        def open_at(r: int, c: int, grid=grid, rows=rows, cols=cols) -> bool:
            return 0 <= r < rows and 0 <= c < cols and grid[r][c] != "X"

        paths, stack = [], [((), divmod(start, cols))]
        while stack:  # every walk of <= 8 moves on open cells
            seq, (r, c) = stack.pop()
            if seq and grid[r][c] == "#":
                paths.append(seq)
            if len(seq) < rows * cols - 1:
                for name, (dr, dc) in moves.items():
                    if open_at(r + dr, c + dc):
                        stack.append(((*seq, name), (r + dr, c + dc)))
        shortest = min((len(s) for s in paths), default=None)
        reference = "infeasible" if shortest is None else " ".join(min(paths, key=len))
        winners = {s for s in paths if len(s) == shortest}
        for n in range(1, 6):
            for seq in itertools.product(moves, repeat=n):
                got = check_shortest_path(reference, " ".join(seq), prompt)[0]
                assert got == (seq in winners), (grid, seq)
        assert check_shortest_path(reference, "infeasible", prompt)[0] == (shortest is None)
