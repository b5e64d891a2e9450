"""Code verification: completion -> program -> verdict (SPEC §7).

The candidate program never contains the tests. It is built from the completion:

1. the code: the last Python fenced block that defines ``def <entry_point>(``, after the
   Python blocks before it that parse on their own (a helper shown first, then the
   function: they are one program; the sanitizer keeps what is needed), else the first
   Python fenced block, else the whole completion (prose ahead of an unfenced program's
   first import/def/class line dropped);
2. the source: for ``code`` tasks (HumanEval) ``prompt + code`` -- a full definition
   redefines the prompt's stub with the prompt's imports in scope, and a body-only
   completion completes the prompt's function; for ``code:program`` tasks (MBPP-style
   prose prompts) the code alone;
3. the program: ``sanitize.sanitize_program`` keeps the imports and the definitions the
   entry point reaches (helpers, classes, constants) and drops top-level demo code
   (prints, example calls, asserts, ``if __name__ == "__main__":``), as EvalPlus's
   sanitizer does. Where no parse defines the entry point, the source is cut at the first
   stop sequence ("\\ndef ", "\\nclass ", "\\nif __name__", "\\nprint(", "\\nassert ")
   after the function instead, and the child reports whatever error remains.

The program runs only in the sandbox child (never in this process); the task's
``check(candidate)`` runs here, in ``cdscope.tasks.sandbox.harness``, against a stand-in that
forwards each call to the child and takes plain data back. The verdict is passed when
``check`` returns: nothing the program does -- exiting early, printing, redefining
``check`` with a trailing decorator, returning an always-equal object, patching
builtins -- can make it so.
"""

from __future__ import annotations

import re
import time

from cdscope.errors import CdscopeError
from cdscope.tasks.judging.sanitize import (
    MAX_SOURCE,
    ReadingTimeout,
    code_start,
    fenced_blocks,
    sanitize_program,
)
from cdscope.tasks.record import PROGRAM_KIND, Task
from cdscope.tasks.sandbox import parse_python, run_check, with_stub_body

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ")
MAX_MESSAGE = 160


class ProgramTooLong(Exception):
    """The program a completion makes is over ``sanitize.MAX_SOURCE`` characters."""


def truncate_at_stop(text: str) -> str:
    """``text`` up to the first stop sequence (all of it when there is none)."""
    cut = min((i for i in (text.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(text))
    return text[:cut]


def _definition(text: str, entry_point: str) -> re.Match[str] | None:
    return re.search(rf"(?m)^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", text)


def extract_code(completion: str, entry_point: str) -> tuple[str, bool]:
    """``(code, is_full_definition)`` from a completion (step 1 of the module docstring)."""
    blocks = fenced_blocks(completion)
    if blocks:
        defining = [i for i, b in enumerate(blocks) if _definition(b, entry_point)]
        if not defining:
            return blocks[0], False
        last = defining[-1]
        before = blocks[:last] if sum(map(len, blocks[: last + 1])) <= MAX_SOURCE else []
        return "\n".join([*(b for b in before if _parses(b)), blocks[last]]), True
    definition = _definition(completion, entry_point)
    if definition is None:
        return completion, False
    return completion[code_start(completion, definition.start()) :], True


def _parses(code: str) -> bool:
    try:
        parse_python(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def _fallback(task: Task, code: str, full: bool) -> str:
    """The pre-sanitizer program: the definition (or body) cut at the first stop sequence."""
    if full:
        definition = _definition(code, task.entry_point or "")
        start = definition.start() if definition is not None else 0
        newline = code.find("\n", start)
        head = code[start:] if newline < 0 else code[start : newline + 1]
        code = head + truncate_at_stop(code[start + len(head) :])
    else:
        code = truncate_at_stop(code)
    if task.verifier == PROGRAM_KIND:
        return code
    return task.prompt + ("\n" + code if full else code)


def build_program(task: Task, completion: str, deadline: float | None = None) -> str:
    """The candidate program (no tests) for ``completion`` of ``task``: ProgramTooLong
    over ``MAX_SOURCE`` characters (bounded before any parse; a program over 8 MiB of
    escaped JSON could not even be sent), ReadingTimeout when ``deadline``
    (``time.monotonic`` seconds) passes while it is read."""
    if not task.tests or not task.entry_point:
        raise CdscopeError(f"task {task.id!r}: a code task needs 'tests' and 'entry_point'")
    code, full = extract_code(completion, task.entry_point)
    if task.verifier == PROGRAM_KIND:
        source = code
    elif full:  # the stub is redefined: give a bare "def f(x):" prompt a body first
        source = with_stub_body(task.prompt) + "\n" + code
    else:
        source = task.prompt + code
    if len(source) > MAX_SOURCE:
        raise ProgramTooLong(f"a program of {len(source):,} characters (over {MAX_SOURCE:,})")
    program = sanitize_program(source, task.entry_point, deadline)
    return (program if program is not None else _fallback(task, code, full)).rstrip("\n") + "\n"


def run_code_task(task: Task, completion: str, *, timeout: float = 5.0) -> tuple[bool, str]:
    """``(passed, message)`` of the task's tests on ``completion`` (candidate sandboxed)."""
    deadline = time.monotonic() + timeout  # the whole verdict: reading it too
    try:
        program = build_program(task, completion, deadline)
    except ReadingTimeout:
        return False, f"timeout after {timeout:.1f}s (reading the program)"
    except ProgramTooLong as exc:
        return False, str(exc)
    passed, message = run_check(task, program, timeout=timeout, deadline=deadline)
    return passed, message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
