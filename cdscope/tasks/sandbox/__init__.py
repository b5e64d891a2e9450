"""The sandbox: where untrusted (model-written) code runs, and how a code verdict is
decided against it without trusting it (docs/tasks.md, "code").

* ``layers``  -- which containment works here (found once), ``run_sandboxed``,
  ``start_candidate``, the refusal of code tasks where no layer hides the host's files
* ``process`` -- one started child: its command line, the minimal root's mount script,
  frames exchanged under one deadline
* ``child``   -- the child's trusted bootstrap and the plain-data wire format both sides speak
* ``harness`` -- a code verdict: the task's tests run here against a stand-in that forwards
  each call to the child

This face is the package's one door for the rest of cdscope; names load on first use.
"""

from __future__ import annotations

from cdscope.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(
        (
            "Layers",
            "SandboxClosed",
            "SandboxProcess",
            "SandboxResult",
            "SandboxTimeout",
            "code_sandbox_available",
            "require_sandbox_for",
            "run_sandboxed",
            "sandbox_available",
            "sandbox_layers",
            "start_candidate",
        ),
        "cdscope.tasks.sandbox.layers",
    ),
    **dict.fromkeys(
        ("CandidateError", "parse_python", "run_check", "with_stub_body"),
        "cdscope.tasks.sandbox.harness",
    ),
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
