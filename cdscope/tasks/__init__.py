"""Verifiable tasks shared by ``cdscope train`` and ``cdscope eval`` (SPEC §5, §7).

* ``format``    -- the Task record, JSONL loading/writing, the shipped train/eval sets
* ``verifiers`` -- ``verify`` / ``verify_many`` and the ``VERIFIERS`` registry
* ``answers``   -- final-answer extraction and exact numeric comparison
* ``logic``     -- structural checks per logic generator
* ``code``      -- candidate programs (``prompt + code``) from completions
* ``harness``   -- code verdicts: the tests run here, the candidate in the sandbox
* ``sandbox``   -- the separate, rlimited, network-less process untrusted code runs in,
  with a minimal root that hides the host's files; ``sandbox_child`` its bootstrap

See docs/tasks.md.
"""

from __future__ import annotations

from cdscope.tasks.format import (
    Task,
    default_task_paths,
    load_tasks,
    task_from_probe_item,
    write_tasks,
)
from cdscope.tasks.verifiers import VERIFIERS, Verdict, verify, verify_many

__all__ = [
    "VERIFIERS",
    "Task",
    "Verdict",
    "default_task_paths",
    "load_tasks",
    "task_from_probe_item",
    "verify",
    "verify_many",
    "write_tasks",
]
