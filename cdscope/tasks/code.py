"""HumanEval-style code verification: completion -> program -> verdict (SPEC §7).

The candidate program is ``prompt + code`` -- the tests are never part of it -- where
``code`` comes from the completion:

1. a fenced block (```python ... ```), if any, replaces the completion (the first one);
2. if that text defines ``def <entry_point>(`` at the start of a line, the whole
   definition (up to the next top-level stop sequence after it) is appended after the
   prompt -- it redefines the prompt's stub, and the prompt's imports stay in scope;
3. otherwise it is a function body: cut at the first stop sequence ("\\ndef ",
   "\\nclass ", "\\nif __name__", "\\nprint(", "\\nassert ") -- text a base model writes
   after finishing the function -- and appended to the prompt.

The program runs only in the sandbox child (never in this process); HumanEval's
``check(candidate)`` runs here, in ``cdscope.tasks.harness``, against a stand-in that
forwards each call to the child and takes plain data back. The verdict is passed when
``check`` returns: nothing the program does -- exiting early, printing, redefining
``check`` with a trailing decorator, returning an always-equal object, patching
builtins -- can make it so.
"""

from __future__ import annotations

import re

from cdscope.errors import CdscopeError
from cdscope.tasks.harness import run_check
from cdscope.tasks.record import Task

STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ")
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)
MAX_MESSAGE = 160


def truncate_at_stop(text: str) -> str:
    """``text`` up to the first stop sequence (all of it when there is none)."""
    cut = min((i for i in (text.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(text))
    return text[:cut]


def extract_code(completion: str, entry_point: str) -> tuple[str, bool]:
    """``(code, is_full_definition)`` from a completion (see the module docstring)."""
    fenced = _FENCE.search(completion)
    text = fenced.group(1) if fenced else completion
    definition = re.search(rf"(?m)^def\s+{re.escape(entry_point)}\s*\(", text)
    if definition is not None:
        start = definition.start()
        head = text[start : text.index("\n", start) + 1] if "\n" in text[start:] else text[start:]
        return head + truncate_at_stop(text[start + len(head) :]), True
    return truncate_at_stop(text), False


def build_program(task: Task, completion: str) -> str:
    """The candidate program (``prompt + code``; no tests) for ``completion`` of ``task``."""
    if not task.tests or not task.entry_point:
        raise CdscopeError(f"task {task.id!r}: a code task needs 'tests' and 'entry_point'")
    code, full = extract_code(completion, task.entry_point)
    return task.prompt + ("\n" + code if full else code) + "\n"


def run_code_task(task: Task, completion: str, *, timeout: float = 5.0) -> tuple[bool, str]:
    """``(passed, message)`` of the task's tests on ``completion`` (candidate sandboxed)."""
    passed, message = run_check(task, build_program(task, completion), timeout=timeout)
    return passed, message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
