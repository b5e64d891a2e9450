"""HumanEval-style code verification: completion -> program -> sandboxed run (SPEC §7).

The program is ``prompt + code + "\\n\\n" + tests + "\\n\\ncheck(entry_point)\\n"``, the
HumanEval harness, where ``code`` comes from the completion:

1. a fenced block (```python ... ```), if any, replaces the completion (the first one);
2. if that text defines ``def <entry_point>(`` at the start of a line, the whole
   definition (up to the next top-level stop sequence after it) is appended after the
   prompt -- it redefines the prompt's stub, and the prompt's imports stay in scope;
3. otherwise it is a function body: cut at the first stop sequence ("\\ndef ",
   "\\nclass ", "\\nif __name__", "\\nprint(", "\\nassert ") -- text a base model writes
   after finishing the function -- and appended to the prompt.

The run happens only in ``cdscope.tasks.sandbox`` (never in this process); it passes
when the program returns normally (the sandbox's marker protocol), i.e. ``check``
raised nothing.
"""

from __future__ import annotations

import re

from cdscope.errors import CdscopeError
from cdscope.tasks.format import Task
from cdscope.tasks.sandbox import run_sandboxed

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
    """The HumanEval test program for ``completion`` of ``task``."""
    if not task.tests or not task.entry_point:
        raise CdscopeError(f"task {task.id!r}: a code task needs 'tests' and 'entry_point'")
    code, full = extract_code(completion, task.entry_point)
    body = task.prompt + ("\n" + code if full else code)
    return f"{body}\n\n{task.tests}\n\ncheck({task.entry_point})\n"


def run_code_task(task: Task, completion: str, *, timeout: float = 5.0) -> tuple[bool, str]:
    """``(passed, message)`` of the task's tests on ``completion``, run in the sandbox."""
    result = run_sandboxed(build_program(task, completion), timeout=timeout)
    if result.completed:
        return True, "ok"
    if result.timed_out:
        return False, f"timeout after {timeout:.1f}s"
    message = result.error
    return False, message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
