"""Verifiable tasks shared by ``cdscope train`` and ``cdscope eval`` (SPEC §5, §7).

Three packages, each with one face, over one record:

* ``record``   -- the ``Task`` record (the bottom: every package below uses it)
* ``sandbox``  -- where model-written code runs (layers, one child, the wire format) and
  the harness that decides a code verdict without trusting the program
* ``judging``  -- how an answer is judged: ``verify`` / ``verify_many``, final answers,
  exact numbers, math-verify, logic checks, programs from completions, the corpus
* ``io``       -- task files and the benchmarks people bring; the contamination audit

Imports go one way: record <- sandbox <- judging <- io (reading a task file checks its
verifier kind). This face re-exports what most callers need; names load on first use.
See docs/tasks.md.
"""

from __future__ import annotations

from cdscope.lazy import lazy_exports

_EXPORTS = {
    "Task": "cdscope.tasks.record",
    **dict.fromkeys(
        ("VERIFIERS", "Verdict", "register_verifier", "verifier_kinds", "verify", "verify_many"),
        "cdscope.tasks.judging",
    ),
    **dict.fromkeys(
        ("default_task_paths", "load_tasks", "task_from_probe_item", "write_tasks"),
        "cdscope.tasks.io",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
