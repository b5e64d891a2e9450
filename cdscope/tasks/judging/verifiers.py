"""Verifiers: is a completion a correct answer to a task? (the reward of SPEC §5, pass@k of §7)

``verify(task, completion)`` dispatches on ``task.verifier`` through ``VERIFIERS``:

* ``math`` -- the final answer (``answers.find_final_answer``: last ``\\boxed{}``, else the
  last answer statement) compared with the reference. A reference that is one number is
  compared exactly (``numeric.read_number``: every spelling of an integer, decimal,
  fraction or scientific number, no floats) and the candidate must be one number too
  (restating the prompt's ``7 - 4 + 2`` is not an answer); the form rule of "simplify"
  tasks applies to every spelling of a fraction (``numeric.form_problem``). Any other
  reference (roots, pi, sets, intervals, tuples, expressions) is compared by math-verify
  under the verdict's deadline (``symbolic``); a reference with no mathematics in it by
  normalised text.
* ``logic`` and ``logic:<generator>`` -- the same extraction, then the generator's
  structural check (``cdscope.tasks.judging.logic``).
* ``code`` (HumanEval: the program is ``prompt + completion``) and ``code:program``
  (MBPP-style prose prompts: the completion alone is the program) -- the task's tests run
  in this process against a stand-in for the program, which runs only in the sandbox
  (``cdscope.tasks.judging.code``, ``cdscope.tasks.sandbox.harness``).

A final statement holding two different answers (``\\boxed{12} or \\boxed{13}``, "12 or
13", "a knight/knave", "Yes or No") is a hedge and wrong, never read as its first option.
More kinds: ``register_verifier`` from Python, or an entry point in the group
``cdscope.verifiers`` (loaded on first use; docs/tasks.md).

``verify_many`` runs code verdicts in a bounded thread pool (each one waits on its own
sandboxed process) and everything else inline. A verdict is ``passed`` plus a short
reason ("ok", "no final answer found", "expected 12, got 13", "timeout after 5.0s").
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from cdscope.errors import CdscopeError
from cdscope.tasks.judging.answers import find_final_answer, show
from cdscope.tasks.judging.logic import LOGIC_CHECKS, check_exact, normalise
from cdscope.tasks.judging.numeric import MAX_DIGITS, form_problem, has_long_digit_run, read_number
from cdscope.tasks.judging.registry import (
    VERIFIERS,
    Verdict,
    register_verifier,
    verifier_for,
    verifier_kinds,
)
from cdscope.tasks.record import Task, is_code_kind

NO_ANSWER = "no final answer found"
HEDGE = "two different final answers (a hedge)"
MAX_SYMBOLIC_TEXT = 2000  # characters of a non-numeric answer given to math-verify
_HEDGE_WORDS = re.compile(r"\bor\b|\\lor\b|\\vee\b|\beither\b", re.IGNORECASE)
_MATHEMATICAL = re.compile(r"[\d\\^(){}\[\]π√∞]")

__all__ = [
    "HEDGE",
    "NO_ANSWER",
    "VERIFIERS",
    "Verdict",
    "register_verifier",
    "verifier_kinds",
    "verify",
    "verify_many",
]


def _reference(task: Task) -> str:
    if task.answer is None:
        raise CdscopeError(f"task {task.id!r}: verifier {task.verifier!r} needs an 'answer'")
    return task.answer


def _numeric(task: Task, reference: str, want, text: str) -> Verdict:  # noqa: ANN001
    got = read_number(text)
    if got is None:
        if has_long_digit_run(text):
            return Verdict(False, f"expected {reference}, got a number of over {MAX_DIGITS} digits")
        return Verdict(False, f"expected {reference}, got non-number {show(text)!r}")
    if got.value != want.value:
        return Verdict(False, f"expected {reference}, got {show(text)}")
    problem = form_problem(want, got, task.prompt)
    if problem is not None:
        return Verdict(False, f"expected {reference}, got {show(text)} ({problem})")
    return Verdict(True, "ok")


def verify_math(task: Task, completion: str, *, timeout: float = 5.0) -> Verdict:
    """The final answer against the reference: exactly, or by math-verify (module doc)."""
    from cdscope.tasks.judging.symbolic import symbolic_equal  # workers start only when needed

    reference = _reference(task)
    found = find_final_answer(completion)
    if found is None:
        return Verdict(False, NO_ANSWER)
    if found.hedged:
        return Verdict(False, HEDGE)
    want = read_number(reference)
    if want is not None:
        return _numeric(task, reference, want, found.text)
    text = found.text
    if normalise(text) == normalise(reference):
        return Verdict(True, "ok")
    if _HEDGE_WORDS.search(text) and not _HEDGE_WORDS.search(reference):
        return Verdict(False, HEDGE)
    if not _MATHEMATICAL.search(reference):
        passed, message = check_exact(reference, text)
        return Verdict(passed, message)
    if len(text) > MAX_SYMBOLIC_TEXT or has_long_digit_run(text):
        return Verdict(False, f"expected {show(reference)}, got an answer too long to compare")
    equal, message = symbolic_equal(reference, text, timeout=timeout)
    if equal is None:  # one side is not mathematics math-verify reads: compare as text
        passed, message = check_exact(reference, text)
        return Verdict(passed, message)
    return (
        Verdict(True, "ok")
        if equal
        else Verdict(False, f"expected {show(reference)}, got {show(text)} ({message})")
    )


def _logic_verifier(kind: str) -> Callable[..., Verdict]:
    check = LOGIC_CHECKS[kind]

    def verify_logic(task: Task, completion: str, *, timeout: float = 5.0) -> Verdict:
        found = find_final_answer(completion)
        if found is None:
            return Verdict(False, NO_ANSWER)
        if found.hedged:
            return Verdict(False, HEDGE)
        passed, message = check(_reference(task), found.text, task.prompt)
        return Verdict(passed, message)

    verify_logic.__name__ = f"verify_{kind.replace(':', '_')}"
    verify_logic.__doc__ = f"Extract the final answer, then ``logic.{check.__name__}``."
    return verify_logic


def verify_code(task: Task, completion: str, *, timeout: float = 5.0) -> Verdict:
    """The task's ``check(candidate)`` here; the program only in the sandbox."""
    from cdscope.tasks.judging.code import run_code_task  # keeps math/logic free of the sandbox

    passed, message = run_code_task(task, completion, timeout=timeout)
    return Verdict(passed, message)


VERIFIERS.update(
    {
        "math": verify_math,
        **{kind: _logic_verifier(kind) for kind in LOGIC_CHECKS},
        "code": verify_code,
        "code:program": verify_code,
    }
)


def verify(task: Task, completion: str, *, timeout: float = 5.0) -> Verdict:
    """The verdict of ``task``'s verifier on ``completion``."""
    return verifier_for(task)(task, completion, timeout=timeout)


def verify_many(
    tasks: Sequence[Task],
    completions: Sequence[str],
    *,
    timeout: float = 5.0,
    workers: int = 2,
) -> list[Verdict]:
    """Verdicts for ``(tasks[i], completions[i])``; code ones in up to ``workers`` sandboxes."""
    if len(tasks) != len(completions):
        raise CdscopeError(
            f"verify_many: {len(tasks)} tasks but {len(completions)} completions; pass one "
            "completion per task (repeat a task for several samples)"
        )
    if workers < 1:
        raise CdscopeError(f"workers must be at least 1, got {workers}")
    verdicts: list[Verdict | None] = [None] * len(tasks)
    code = [i for i, task in enumerate(tasks) if is_code_kind(task.verifier)]
    for index, task in enumerate(tasks):
        if not is_code_kind(task.verifier):
            verdicts[index] = verify(task, completions[index], timeout=timeout)
    if code:
        with ThreadPoolExecutor(max_workers=min(workers, len(code))) as pool:
            futures = {
                i: pool.submit(verify, tasks[i], completions[i], timeout=timeout) for i in code
            }
            for index, future in futures.items():
                verdicts[index] = future.result()
    return [v for v in verdicts if v is not None]
