"""Verifiers: is a completion a correct answer to a task? (the reward of SPEC §5, pass@k of §7)

``verify(task, completion)`` dispatches on ``task.verifier`` through ``VERIFIERS``:

* ``math`` -- the final answer (``answers.find_final_answer``: last ``\\boxed{}``, else
  last "answer is X") parsed to an exact ``Fraction`` and compared with the reference;
  a reference written as a reduced fraction ``a/b`` also requires the candidate, when
  it is written as a fraction, to be reduced ("simplify" tasks). A reference that is
  not a number falls back to a normalised string match.
* ``logic`` and ``logic:<generator>`` -- the same extraction, then the generator's
  structural check (``cdscope.tasks.logic``).
* ``code`` -- HumanEval's ``check(candidate)`` run in this process against a stand-in
  for ``prompt + completion``, which runs only in the sandbox (``cdscope.tasks.code``,
  ``cdscope.tasks.harness``): the verdict cannot be forged by the code it judges.

``verify_many`` runs code verdicts in a bounded thread pool (each one waits on its own
sandboxed process) and everything else inline. A verdict is ``passed`` plus a short
reason ("ok", "no final answer found", "expected 12, got 13", "timeout after 5.0s").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cdscope.errors import CdscopeError
from cdscope.tasks.answers import find_final_answer, is_reduced_fraction_text, parse_number, show
from cdscope.tasks.logic import LOGIC_CHECKS, check_exact
from cdscope.tasks.record import Task, is_code_kind

NO_ANSWER = "no final answer found"


@dataclass(frozen=True)
class Verdict:
    """Whether the completion passed, and a short reason."""

    passed: bool
    message: str


def _reference(task: Task) -> str:
    if task.answer is None:
        raise CdscopeError(f"task {task.id!r}: verifier {task.verifier!r} needs an 'answer'")
    return task.answer


def verify_math(task: Task, completion: str, *, timeout: float = 5.0) -> Verdict:
    """Exact numeric comparison of the final answer with the reference (see module doc)."""
    reference = _reference(task)
    found = find_final_answer(completion)
    if found is None:
        return Verdict(False, NO_ANSWER)
    want = parse_number(reference)
    if want is None:
        passed, message = check_exact(reference, found.text)
        return Verdict(passed, message)
    got = parse_number(found.text)
    if got is None:
        return Verdict(False, f"expected {reference}, got non-number {show(found.text)!r}")
    if got != want:
        return Verdict(False, f"expected {reference}, got {show(found.text)}")
    if is_reduced_fraction_text(reference) and is_reduced_fraction_text(found.text) is False:
        return Verdict(False, f"expected {reference}, got {show(found.text)} (not in lowest terms)")
    return Verdict(True, "ok")


def _logic_verifier(kind: str) -> Callable[..., Verdict]:
    check = LOGIC_CHECKS[kind]

    def verify_logic(task: Task, completion: str, *, timeout: float = 5.0) -> Verdict:
        found = find_final_answer(completion)
        if found is None:
            return Verdict(False, NO_ANSWER)
        passed, message = check(_reference(task), found.text, task.prompt)
        return Verdict(passed, message)

    verify_logic.__name__ = f"verify_{kind.replace(':', '_')}"
    verify_logic.__doc__ = f"Extract the final answer, then ``logic.{check.__name__}``."
    return verify_logic


def verify_code(task: Task, completion: str, *, timeout: float = 5.0) -> Verdict:
    """HumanEval ``check(candidate)`` here; ``prompt + completion`` only in the sandbox."""
    from cdscope.tasks.code import run_code_task  # keeps math/logic free of the sandbox

    passed, message = run_code_task(task, completion, timeout=timeout)
    return Verdict(passed, message)


VERIFIERS: dict[str, Callable[..., Verdict]] = {
    "math": verify_math,
    **{kind: _logic_verifier(kind) for kind in LOGIC_CHECKS},
    "code": verify_code,
}


def verify(task: Task, completion: str, *, timeout: float = 5.0) -> Verdict:
    """The verdict of ``task``'s verifier on ``completion``."""
    verifier = VERIFIERS.get(task.verifier)
    if verifier is None:
        raise CdscopeError(
            f"task {task.id!r}: unknown verifier kind {task.verifier!r} "
            f"(known: {', '.join(sorted(VERIFIERS))})"
        )
    return verifier(task, completion, timeout=timeout)


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
