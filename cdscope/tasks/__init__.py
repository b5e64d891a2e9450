"""Verifiable tasks shared by ``cdscope train`` and ``cdscope eval`` (SPEC §5, §7).

* ``format``    -- the Task record, loading/writing, the shipped train/eval sets
* ``readers``   -- JSONL / Parquet / datasets folders in GSM8K, MATH, HumanEval, MBPP columns
* ``verifiers`` -- ``verify`` / ``verify_many``; ``registry``: ``register_verifier`` and
  the ``cdscope.verifiers`` entry points
* ``answers``   -- final-answer extraction; ``numeric``: exact numbers and the form rule;
  ``symbolic``: math-verify in killable worker processes
* ``sanitize``  -- the program a code completion needs (EvalPlus's design)
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
from cdscope.tasks.verifiers import (
    VERIFIERS,
    Verdict,
    register_verifier,
    verifier_kinds,
    verify,
    verify_many,
)

__all__ = [
    "VERIFIERS",
    "Task",
    "Verdict",
    "default_task_paths",
    "load_tasks",
    "register_verifier",
    "task_from_probe_item",
    "verifier_kinds",
    "verify",
    "verify_many",
    "write_tasks",
]
