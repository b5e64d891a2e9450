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

``verify_many`` runs every verdict that can wait (``may_wait``) in a pool of ``workers``
threads -- a code verdict waits on its own sandboxed process, a symbolic comparison on its
math-verify worker, a plugin on its own code -- and the rest inline meanwhile, so the
slow ones of a batch run side by side and the batch takes about ceil(slow / workers) x
``timeout``, however they are mixed (they ran one after another before: 8 hostile + 8
honest symbolic answers, 46 s at the 5 s default). A verdict is ``passed`` plus a short
reason ("ok", "no final answer found", "expected 12, got 13", "timeout after 5.0s").

**The deadline** (``timeout``, seconds) bounds the whole verdict: reading a code
completion into its program counts against it and the sandbox child gets what is left;
a reply from the child is read, parsed and decoded within it, and one parse is bounded
in size before it starts. A symbolic comparison's worker is killed at it (a worker's own
start, about 0.7 s, has its own bound and runs ahead while comparisons are in flight).
Math and logic verdicts are linear in the completion, with no deadline to check: 100k
characters of any shape take milliseconds.

**A verdict for every completion.** Whatever a completion holds, ``verify`` returns a
verdict: an exception raised while judging it scores that completion 0 with the reason
``verifier error: <type>: <message>`` (``Verdict.crashed``) and never reaches the batch
-- in GRPO one bad completion must cost its own reward, not the step. A completion over
``MAX_COMPLETION`` characters scores 0 unread. Errors of the *task* (no ``answer``, an
unknown kind, tests that do not compile) are still ``CdscopeError``: they are the task
file's, would score every completion, and are refused when tasks are loaded.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from cdscope.errors import CdscopeError
from cdscope.tasks.judging.answers import find_final_answer, show
from cdscope.tasks.judging.logic import LOGIC_CHECKS, MULTILINE_KINDS, check_exact, normalise
from cdscope.tasks.judging.numeric import (
    MAX_DIGITS,
    form_problem,
    has_long_digit_run,
    has_long_number,
    read_number,
)
from cdscope.tasks.judging.registry import (
    VERIFIER_ERROR,
    VERIFIERS,
    Verdict,
    register_verifier,
    verifier_for,
    verifier_kinds,
)
from cdscope.tasks.record import Task

NO_ANSWER = "no final answer found"
HEDGE = "two different final answers (a hedge)"
MAX_COMPLETION = 1_000_000  # characters of a completion read at all
MAX_SYMBOLIC_TEXT = 2000  # characters of a non-numeric answer given to math-verify
_HEDGE_WORDS = re.compile(r"\bor\b|\\lor\b|\\vee\b|\beither\b", re.IGNORECASE)
_MATHEMATICAL = re.compile(r"[\d\\^(){}\[\]π√∞]")

__all__ = [
    "HEDGE",
    "MAX_COMPLETION",
    "NO_ANSWER",
    "VERIFIER_ERROR",
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
        if has_long_number(text):
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
    from cdscope.tasks.judging.symbolic import symbolic_equal, transform  # workers on demand

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
    equal, message = symbolic_equal(reference, text, timeout=timeout, form=transform(task.prompt))
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
        text = found.block if kind in MULTILINE_KINDS else found.text
        passed, message = check(_reference(task), text, task.prompt)
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
    """The verdict of ``task``'s verifier on ``completion``, never an exception of the
    completion's making (module docstring); ``seconds`` is how long it took."""
    function = verifier_for(task)
    start = time.perf_counter()
    if not isinstance(completion, str):
        verdict = Verdict(False, f"the completion is a {type(completion).__name__}, not text")
    elif len(completion) > MAX_COMPLETION:
        verdict = Verdict(
            False, f"a completion of {len(completion):,} characters (read up to {MAX_COMPLETION:,})"
        )
    else:
        try:
            verdict = function(task, completion, timeout=timeout)
        except CdscopeError:
            raise  # the task's own error (module docstring)
        except Exception as exc:  # MemoryError, RecursionError, a verifier's bug
            verdict = Verdict(False, f"{VERIFIER_ERROR}: {type(exc).__name__}: {show(str(exc))}")
    return replace(verdict, seconds=time.perf_counter() - start)


def verify_many(
    tasks: Sequence[Task],
    completions: Sequence[str],
    *,
    timeout: float = 5.0,
    workers: int = 2,
) -> list[Verdict]:
    """Verdicts for ``(tasks[i], completions[i])``, in order, judged on up to ``workers``
    threads (module docstring)."""
    if len(tasks) != len(completions):
        raise CdscopeError(
            f"verify_many: {len(tasks)} tasks but {len(completions)} completions; pass one "
            "completion per task (repeat a task for several samples)"
        )
    if workers < 1:
        raise CdscopeError(f"workers must be at least 1, got {workers}")
    waiting = [i for i, task in enumerate(tasks) if may_wait(task)]
    verdicts: dict[int, Verdict] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(waiting)))) as pool:
        futures = {
            i: pool.submit(verify, tasks[i], completions[i], timeout=timeout) for i in waiting
        }
        for index, (task, completion) in enumerate(zip(tasks, completions, strict=True)):
            if index not in futures:  # the pool works meanwhile
                verdicts[index] = verify(task, completion, timeout=timeout)
        verdicts.update({i: future.result() for i, future in futures.items()})
    return [verdicts[i] for i in range(len(tasks))]


def may_wait(task: Task) -> bool:
    """Whether ``task``'s verdict can wait on something else -- a sandbox (code), a
    math-verify worker (a math reference that is not one number), a plugin's own code --
    and so runs in ``verify_many``'s pool; the built-in math and logic checks of a number
    or a text take microseconds and run inline (a thread hop cost more than they do)."""
    if task.verifier == "math":
        return task.answer is None or not _is_number(task.answer)
    return task.verifier not in LOGIC_CHECKS


@functools.lru_cache(maxsize=4096)
def _is_number(reference: str) -> bool:
    return read_number(reference) is not None
