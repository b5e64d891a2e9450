"""Verdicts bounded whatever the reply (issue #25): every attack here crashed, stalled or
passed on the previous verifier, as its test says."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cdscope.tasks import Task, verify, verify_many
from cdscope.tasks.judging.answers import find_final_answer
from cdscope.tasks.sandbox import code_sandbox_available
from tests.tasks.routes import ADD, forged_replies

ROOT = Path(__file__).resolve().parents[2]
needs_sandbox = pytest.mark.skipif(not code_sandbox_available()[0], reason="no code sandbox")
GRID = "Now, find the shortest path from * to # in the following grid:\n* O\nO #\nSolution:\n"


def _task(kind: str, answer: str, prompt: str = "q") -> Task:
    return Task(f"t/{kind}", kind.split(":")[0], prompt, kind, answer=answer)


@pytest.mark.parametrize(
    "text",
    [
        "\\boxed{" * 8000,  # 56k characters of unclosed boxes: 27 s before
        "\\boxed{" * 8000 + "}",
        "{" * 56_000 + "\\boxed{1}",
        "The answer is " * 4000,
        "Answer: " + "\\(" * 28_000,
    ],
)
def test_extraction_is_linear(text: str) -> None:
    start = time.perf_counter()
    find_final_answer(text)
    verify(_task("math", "1"), text)
    assert time.perf_counter() - start < 1.0  # floor 0.04 s measured at 1 and 2 threads


@pytest.mark.parametrize(
    ("kind", "answer", "prompt"),
    [
        ("math", "12", "q"),
        ("math", "51/460", "Simplify the fraction 5049/45540 to its lowest terms."),
        ("math", "\\sqrt{2}", "q"),
        ("logic:number_sorting", "['1', '2']", "q"),
        ("logic:shortest_path", "right down", GRID),
        ("logic:knights_knaves", "Jack is a knight", "q"),
        ("logic:syllogism", "Yes", "q"),
    ],
)
def test_a_5000_digit_answer_is_a_wrong_answer(kind: str, answer: str, prompt: str) -> None:
    """``Fraction()`` raised on it inside the reward step before, failing the batch."""
    huge = "9" * 5000
    task = _task(kind, answer, prompt)
    for completion in (f"\\boxed{{{huge}}}", f"Answer: [{huge}, 1]", f"#### {huge}/7"):
        assert verify(task, completion).passed is False


@pytest.mark.parametrize(
    ("answer", "completion", "passed"),
    [
        # math-verify's side of the parity corpus: roots, pi, scientific, sets, intervals, tuples
        ("\\sqrt{2}", "\\boxed{\\sqrt 2}", True),
        ("\\frac{\\sqrt{8}}{2}", "Answer: $\\sqrt{2}$", True),
        ("2\\sqrt{3}", "\\boxed{\\sqrt{12}}", True),
        ("\\frac{\\pi}{2}", "\\boxed{\\pi/2}", True),
        ("\\frac{\\pi}{2}", "\\boxed{\\frac{1}{2}\\pi}", True),
        ("\\{1, 2\\}", "\\boxed{\\{2, 1\\}}", True),
        ("[0, 1)", "Final answer: $[0,1)$", True),
        ("(1, 2)", "\\boxed{(1,2)}", True),
        ("x^2 + 1", "\\boxed{1 + x^2}", True),
        ("\\sqrt{2}", "\\boxed{1.41}", False),  # math-verify accepts 6 correct decimals
        ("\\frac{\\pi}{2}", "\\boxed{\\pi}", False),
        ("\\{1, 2\\}", "\\boxed{\\{1, 3\\}}", False),
        ("[0, 1)", "\\boxed{[0, 1]}", False),
        ("(1, 2)", "\\boxed{(2, 1)}", False),
        ("\\sqrt{2}", "\\boxed{\\sqrt{2}} or \\boxed{-\\sqrt{2}}", False),
        ("\\sqrt{2}", "Answer: \\sqrt{2} or -\\sqrt{2}", False),
        # exact numbers: scientific notation, units, LaTeX, and restating the question
        ("1500", "\\boxed{1.5 \\times 10^{3}}", True),
        ("1500", "Answer: 1.5e3", True),
        ("5", "\\boxed{5 \\text{ cm}}", True),
        ("0.75", "\\boxed{\\tfrac{3}{4}}", True),
        ("-0.5", "\\boxed{-\\frac{1}{2}}", True),
        ("12", "\\boxed{7 - 4 + 9}", False),
        ("120", "\\boxed{5!}", False),
        ("5", "\\boxed{5!}", False),
    ],
)
def test_math_equivalence(answer: str, completion: str, passed: bool) -> None:
    verdict = verify(_task("math", answer), completion)
    assert verdict.passed is passed, verdict.message


def test_symbolic_comparison_is_bounded_off_the_main_thread() -> None:
    """math-verify's own timeouts are signal alarms (main thread only; the trainer
    verifies from threads): its worker is killed at the deadline instead, and the next
    comparison gets a fresh one."""
    task = _task("math", "\\sqrt{2}")
    with ThreadPoolExecutor(2) as pool:
        verify(task, "\\boxed{\\sqrt{2}}")  # the worker starts (its start is not timed)
        start = time.perf_counter()
        slow = pool.submit(verify, task, "\\boxed{10^{10^{10}}}", timeout=1.0).result()
        took = time.perf_counter() - start
        fine = pool.submit(verify, task, "\\boxed{\\sqrt{2}}", timeout=5.0).result()
    assert (slow.passed, fine.passed) == (False, True)
    assert "timeout after 1.0s" in slow.message
    assert took < 3.0  # floor 1.0 s (the deadline) + a worker start of ~0.7 s under load


@needs_sandbox
def test_control_flow_exceptions_do_not_reach_the_tests() -> None:
    """A candidate raising StopIteration inside ``all(map(candidate, ...))`` ended the
    tests' iteration early, so wrong code passed; GeneratorExit, KeyboardInterrupt and
    SystemExit must not reach a test as themselves either."""
    task = Task(
        "code/all",
        "code",
        "def positive(x):\n",
        "code",
        tests=(
            "def check(candidate):\n"
            "    assert all(map(candidate, [1, 2, 3]))\n"
            "    try:\n"
            "        candidate(-1)\n"
            "    except (StopIteration, GeneratorExit, KeyboardInterrupt, SystemExit):\n"
            "        return\n"
            "    assert not candidate(-1)\n"
        ),
        entry_point="positive",
    )
    raising = [f"    raise {name}\n" for name in ("StopIteration", "GeneratorExit")]
    raising += ["    raise KeyboardInterrupt\n", "    raise SystemExit(0)\n"]
    verdicts = verify_many([task] * 5, [*raising, "    return x > 0\n"], timeout=5.0)
    assert [v.passed for v in verdicts] == [False] * 4 + [True], verdicts


@needs_sandbox
def test_verdict_messages_come_from_the_parent() -> None:
    """A child that printed "ok" on stderr and died supplied "ok" as the verdict message."""
    forged = (
        "    import os, sys\n    sys.stderr.write('ok\\n'); sys.stderr.flush()\n    os._exit(1)\n"
    )
    at_import = (
        "    return a + b + ZERO\nimport sys\nsys.stderr.write('ok')\nZERO = sys.exit('ok')\n"
    )
    dead, failed = verify(ADD, forged), verify(ADD, at_import)
    assert dead.message == "the program ended early (exit code 1 before the end of the program)"
    assert failed.message == "program failed: SystemExit (program line 4)"
    assert not dead.passed and not failed.passed


# The program writes its own reply frame: 4,096 tuples whose hashes collide
# (hash(M*k + 1) == 1) and whose comparison walks 50 shared items first (under the
# 262,144 values a reply may hold: more is refused before parsing, issue #38).
COLLIDING_REPLY = forged_replies(
    "    M = 2**61 - 1\n"
    "    pad = list(range(50))\n"
    '    items = [{"t": [{"t": pad}, M * k + 1]} for k in range(1, 4097)]\n'
    '    body = json.dumps({"r": {"s": items}}, separators=(",", ":")).encode()\n'
)


@needs_sandbox
def test_hash_colliding_reply_gets_its_verdict_within_three_timeouts() -> None:
    """It held the verdict 15.8 s at a 5 s timeout before (38-77 s in the issue's variant):
    the decoder now refuses more than 16 elements of one hash before building a set."""
    start = time.perf_counter()
    verdict = verify(ADD, COLLIDING_REPLY, timeout=2.0)
    assert time.perf_counter() - start < 3 * 2.0
    assert not verdict.passed and "with one hash" in verdict.message


FRESH = textwrap.dedent(
    """
    from cdscope.tasks.record import Task
    from cdscope.tasks.sandbox import sandbox_layers
    from cdscope.tasks.judging.verifiers import verify_many
    add = Task("c/add", "code", "def add(a, b):\\n", "code",
               tests="def check(candidate):\\n    assert candidate(1, 2) == 3\\n", entry_point="add")
    verdicts = verify_many([add, add], ["    return a + b\\n", "    return a - b\\n"], workers=2)
    print([v.passed for v in verdicts], sandbox_layers().mount)
    """
)


@needs_sandbox
def test_verify_many_from_fresh_processes_never_raises() -> None:
    """Layer detection raced between verify_many's two threads in a fresh process and
    raised ``SandboxClosed: Broken pipe`` about one run in three (8 runs: 1 crash)."""
    outputs = []
    for batch in range(4):  # 20 fresh processes, five at a time
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", FRESH],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(5)
        ]
        outputs += [p.communicate(timeout=120)[0].strip().splitlines()[-1:] for p in procs]
        del batch
    assert outputs == [["[True, False] True"]] * 20
