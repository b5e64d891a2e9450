"""Run untrusted Python (model-written code) in a contained, separate process.

Layers, outermost first (``sandbox_layers()`` says which are active on this machine):

1. **Separate process** in its own session; on timeout or when its caller is done, the
   whole process group gets SIGKILL (and ``unshare --kill-child`` ends the namespaced
   child with it). Nothing generated is ever executed in the calling process.
2. **Unprivileged user** -- when cdscope runs as root, the child runs as ``nobody``
   (65534): it cannot write any file it does not own, cannot signal our processes or
   read their memory, and ``RLIMIT_NPROC`` binds (root ignores it).
3. **User, network and PID namespaces** (``unshare --user --map-root-user --net --pid``)
   where the kernel allows it: no network at all (a down loopback only), no other
   process visible or signalable.
4. **Mount namespace with a minimal root** (``Layers.mount``): a shell builds a fresh
   tmpfs root holding only read-only binds of ``/usr``, ``/bin``, ``/lib*`` (and the
   interpreter's own prefix when it lives elsewhere), ``/dev/null``, ``/dev/urandom``
   and a private work dir (``MOUNT_WORKDIR``, its own tmpfs) -- no ``/proc``; the root
   is remounted read-only, ``chroot`` enters it and the interpreter starts with every
   capability dropped (``setpriv``; without CAP_SYS_CHROOT and with no ``/proc`` the
   chroot cannot be left). Task files, the repository, home directories and the
   parent's ``/proc`` are simply not there. This is the layer that *isolates files*:
   code tasks (``cdscope.tasks.sandbox.harness``) run only where it works.
5. **Resource limits** set by the child's bootstrap before the program starts: CPU
   seconds, address space (``memory_mb``), file size, open files, no new processes,
   no core dumps.
6. **Isolated interpreter** ``python -I -S -B``: no site-packages, no ``PYTHON*``
   variables, no user site, no bytecode written; the environment is scrubbed to a
   minimal PATH/LANG/HOME; cwd is a fresh, private work directory.
7. **Audit hook** (PEP 578) inside the child: refuses ``os.system``, ``subprocess``,
   ``os.exec*``/``spawn``/``fork``, ``os.kill``, sockets, ``ctypes``, writes and file
   changes whose symlink-resolved target is outside the work dir, ``dir_fd``
   arguments and descriptors of directories, and reads under ``/proc`` and ``/sys``.

The child talks to the parent in frames (``child``) over a descriptor of its
own; its stdout/stderr go to capped log files. No layer here decides a verdict: code
verdicts are the harness's, which keeps the tests in this process. What the layers do
not protect against is documented in docs/tasks.md (kernel exploits, CPU-cache side
channels, interpreter bugs that escape the audit hook).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cdscope.errors import CdscopeError
from cdscope.resources import default_task_dir
from cdscope.tasks.record import Task, is_code_kind
from cdscope.tasks.sandbox import child as wire
from cdscope.tasks.sandbox.process import (
    ENV_PATH,
    MAX_OUTPUT_BYTES,
    MOUNT_WORKDIR,
    TOOL_PATH,
    Layers,
    SandboxClosed,
    SandboxProcess,
    SandboxTimeout,
    data_dirs,
    exit_reason,
    host_binds,
)

__all__ = [
    "MAX_OUTPUT_BYTES",
    "MOUNT_WORKDIR",
    "Layers",
    "SandboxClosed",
    "SandboxProcess",
    "SandboxResult",
    "SandboxTimeout",
    "code_sandbox_available",
    "exit_reason",
    "require_sandbox_for",
    "run_sandboxed",
    "sandbox_available",
    "sandbox_layers",
    "start_candidate",
]

_TOOLS = ("sh", "mount", "chroot", "setpriv", "mkdir", "ln")
# What the mount layer must hide before it counts (those that exist here): the task dir
# (the repository's tasks/ or $CDSCOPE_TASKS) and the home directory -- unless the
# interpreter itself lives there (pyenv, conda): then only its own prefix is bound.
_HIDDEN = [p for p in (default_task_dir().resolve(), Path.home()) if p.exists() and str(p) != "/"]


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did. ``completed``: the program returned normally -- as the
    child reports it, so a program could forge it: it is no verdict (see the harness)."""

    completed: bool
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    seconds: float

    @property
    def error(self) -> str:
        """One line saying why the run did not complete ("" when it did)."""
        if self.completed:
            return ""
        if self.timed_out:
            return "timeout"
        return exit_reason(self.stderr, self.returncode)


def _interpreters() -> list[str]:
    found = [sys.executable, getattr(sys, "_base_executable", "")]
    found += [shutil.which("python3", path=ENV_PATH) or "", "/usr/bin/python3"]
    unique: list[str] = []
    for path in found:
        if path and os.path.exists(path) and path not in unique:
            unique.append(path)
    return unique


def _candidates() -> list[tuple[bool, bool, bool]]:
    """(drop_user, namespaces, mount) from strongest to weakest."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    has_unshare = shutil.which("unshare", path=ENV_PATH) is not None
    has_mount = has_unshare and all(shutil.which(b, path=TOOL_PATH) for b in _TOOLS)
    order = [(d, True, m) for d in (True, False) for m in (True, False)]
    order += [(True, False, False), (False, False, False)]
    return [
        (d, n, m)
        for d, n, m in order
        if (root or not d) and (has_unshare or not n) and (has_mount or not m)
    ]


def _try_layers(layers: Layers) -> bool:
    """Run a probe; for the mount layer it must also find the host's files hidden."""
    probe = "import socket\nprint(sum(range(5)))\n"
    if layers.mount:
        binds = host_binds(layers.interpreter)
        hidden = [str(p) for p in _HIDDEN] + data_dirs()
        hidden = [
            h
            for h in hidden
            if h != str(Path.home()) or not any(b.startswith(h + "/") for b in binds)
        ]
        probe += (  # gone, or masked by an empty dir (installed inside a bound prefix)
            "import os\nassert not any(os.path.exists(p) and (not os.path.isdir(p) or "
            f"os.listdir(p)) for p in {hidden!r})\n"
        )
    try:
        result = _run(probe, layers, timeout=10.0, memory_mb=512, audit_hook=True)
    except (OSError, SandboxClosed, SandboxTimeout, wire.WireError):
        return False  # e.g. the child exited before reading its settings: Broken pipe
    return result.completed and result.stdout.strip() == "10"


def _search() -> tuple[Layers | None, str]:
    if os.name != "posix":
        return None, f"the sandbox needs a POSIX system (this is {os.name})"
    tried = []
    for drop_user, namespaces, mount in _candidates():
        for interpreter in _interpreters():
            layers = Layers(interpreter, drop_user, namespaces, mount)
            if _try_layers(layers):
                return layers, ""
            tried.append(layers.describe())
    return None, f"no sandbox configuration could run a test program (tried: {'; '.join(tried)})"


_detect_lock = threading.Lock()
_detected: list[tuple[Layers | None, str]] = []


def _detect() -> tuple[Layers | None, str]:
    """The layers that work here, found once per process under a lock (two threads of
    ``verify_many`` starting together must not probe concurrently); anything that goes
    wrong while probing is a one-line reason, never an exception out of a verdict."""
    with _detect_lock:
        if not _detected:
            try:
                _detected.append(_search())
            except Exception as exc:  # detection must not crash a verdict
                _detected.append((None, f"sandbox detection failed: {type(exc).__name__}: {exc}"))
        return _detected[0]


def sandbox_layers() -> Layers | None:
    """The strongest containment that works here, or None when none does."""
    return _detect()[0]


def sandbox_available() -> tuple[bool, str]:
    """``(True, description of the active layers)`` or ``(False, why not)``."""
    layers, reason = _detect()
    return (True, layers.describe()) if layers is not None else (False, reason)


def code_sandbox_available() -> tuple[bool, str]:
    """Like ``sandbox_available``, but code tasks also need the layer that hides the
    host's files (the tests must be out of the candidate's reach)."""
    ok, reason = sandbox_available()
    layers = sandbox_layers()
    if ok and layers is not None and not layers.mount:
        return False, f"no layer here hides the host's files from the child ({reason})"
    return ok, reason


def require_sandbox_for(tasks: Sequence[Task], remedy: str) -> None:
    """Refuse (before any generation) when ``tasks`` hold code tasks and no sandbox that
    isolates files works: generated code is never run without one. ``remedy`` ends the
    one-line message."""
    if any(is_code_kind(t.verifier) for t in tasks):
        ok, reason = code_sandbox_available()
        if not ok:
            raise CdscopeError(
                f"cannot score code tasks: no sandbox here ({reason}); generated code is never "
                f"run unsandboxed - {remedy}"
            )


def _run(
    program: str, layers: Layers, *, timeout: float, memory_mb: int, audit_hook: bool
) -> SandboxResult:
    settings = {"program": program, "audit_hook": audit_hook}
    completed = timed_out = False
    with SandboxProcess(layers, settings, timeout=timeout, memory_mb=memory_mb) as child:
        try:
            completed = child.receive() == {"done": True}
            if completed:  # the bootstrap exits right after; give it the time left
                child.proc.wait(max(0.0, child.deadline - time.monotonic()))
        except SandboxTimeout:
            timed_out = True
        except (SandboxClosed, wire.WireError, subprocess.TimeoutExpired):
            pass
    seconds = time.perf_counter() - child.start
    return SandboxResult(
        completed, child.returncode, timed_out, child.stdout, child.stderr, seconds
    )


def _check_settings(timeout: float, memory_mb: int) -> Layers:
    if timeout <= 0:
        raise CdscopeError(f"sandbox timeout must be positive, got {timeout}")
    if memory_mb < 64:
        raise CdscopeError(f"sandbox memory_mb must be at least 64, got {memory_mb}")
    layers, reason = _detect()
    if layers is None:
        raise CdscopeError(f"refusing to run generated code without a sandbox: {reason}")
    return layers


def run_sandboxed(
    program: str, *, timeout: float, memory_mb: int = 512, audit_hook: bool = True
) -> SandboxResult:
    """Run ``program`` (Python source) in the sandbox; never in this process.

    ``timeout`` is wall-clock seconds for the whole run (the process group is killed
    after it); the CPU limit is the same, rounded up, plus one second. ``audit_hook=False``
    switches off the in-process layer only -- for tests of the OS layers underneath.
    Raises CdscopeError when no sandbox works here (code is then never run).
    """
    layers = _check_settings(timeout, memory_mb)
    return _run(program, layers, timeout=timeout, memory_mb=memory_mb, audit_hook=audit_hook)


def start_candidate(
    program: str, entry_point: str, *, timeout: float, memory_mb: int = 512
) -> SandboxProcess:
    """A child that runs ``program`` and then serves calls of ``entry_point`` (frames in
    ``child``); only where the files-isolating layer works (CdscopeError else)."""
    layers = _check_settings(timeout, memory_mb)
    ok, reason = code_sandbox_available()
    if not ok:
        raise CdscopeError(f"refusing to run generated code for a code task: {reason}")
    settings = {"program": program, "entry_point": entry_point, "audit_hook": True}
    return SandboxProcess(layers, settings, timeout=timeout, memory_mb=memory_mb)
