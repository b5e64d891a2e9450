"""Run untrusted Python (model-written code) in a contained, separate process.

Layers, outermost first (``sandbox_layers()`` says which are active on this machine):

1. **Separate process** in its own session; on timeout the whole process group gets
   SIGKILL. Nothing generated is ever executed in the calling process.
2. **Unprivileged user** -- when cdscope runs as root, the child runs as ``nobody``
   (65534): it cannot write any file it does not own, cannot signal our processes,
   and ``RLIMIT_NPROC`` binds (root ignores it).
3. **User + network namespace** (``unshare --user --map-root-user --net``) where the
   kernel allows it: the child sees only a down loopback device -- no network at all.
   With ``--mount`` as well, a shell remounts the host's root read-only and puts
   private tmpfs over ``/tmp``, ``/var/tmp`` and ``/dev/shm`` (the work dir lives there).
4. **Resource limits** set by the child's bootstrap before the program starts: CPU
   seconds, address space (``memory_mb``), file size, open files, no new processes,
   no core dumps.
5. **Isolated interpreter** ``python -I -S -B``: no site-packages, no ``PYTHON*``
   variables, no user site, no bytecode written; the environment is scrubbed to a
   minimal PATH/LANG/HOME; cwd is a fresh temporary directory, removed afterwards.
6. **Audit hook** (PEP 578) inside the child: refuses ``os.system``, ``subprocess``,
   ``os.exec*``/``spawn``/``fork``, ``os.kill``, sockets, ``ctypes``, writes and file
   changes outside the temporary directory, reads under ``/proc`` and ``/sys``, and
   frame/GC introspection (so the program cannot find the success marker).

The child prints a random marker only if the program returns normally, so
``os._exit(0)`` cannot fake a pass. What it does not protect against is documented in
docs/tasks.md (reads of world-readable host files, kernel exploits, CPU-cache side
channels, a determined program escaping the audit hook through interpreter bugs).
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cdscope.errors import CdscopeError
from cdscope.tasks.format import Task, is_code_kind

NOBODY = 65534
MAX_OUTPUT_BYTES = 64 * 1024  # of stdout/stderr kept for the result
_BOOTSTRAP = Path(__file__).with_name("sandbox_child.py")
_UNSHARE = ("unshare", "--user", "--map-root-user", "--net")
MOUNT_WORKDIR = "/tmp/cdscope-work"
# Run by /bin/sh inside the new mount namespace, then exec'd into the interpreter: the
# host's root read-only, private tmpfs over the world-writable directories.
_MOUNT_SCRIPT = (
    "set -e; mount -o remount,bind,ro /; "
    'for d in /tmp /var/tmp /dev/shm; do if [ -d "$d" ]; then '
    'mount -t tmpfs -o size=64m,mode=1777 tmpfs "$d"; fi; done; '
    f'mkdir -m 700 {MOUNT_WORKDIR}; cd {MOUNT_WORKDIR}; unset PWD OLDPWD; exec "$0" "$@"'
)
_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run did. ``completed``: the program returned normally."""

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
        lines = [line.strip() for line in self.stderr.splitlines() if line.strip()]
        if lines:
            return lines[-1]
        if self.returncode is not None and self.returncode < 0:
            try:
                return f"killed by {signal.Signals(-self.returncode).name}"
            except ValueError:
                return f"killed by signal {-self.returncode}"
        return f"exit code {self.returncode} before the end of the program"


@dataclass(frozen=True)
class Layers:
    """The containment this machine supports (found once by trying it)."""

    interpreter: str
    drop_user: bool
    namespaces: bool
    mount: bool = False

    def describe(self) -> str:
        parts = ["separate process group"]
        if self.drop_user:
            parts.append("user nobody")
        parts.append(
            "user+net namespace (no network)" if self.namespaces else "NO network namespace"
        )
        if self.mount:
            parts.append("mount namespace (host read-only, private /tmp)")
        parts += ["rlimits", "isolated interpreter", "audit hook"]
        return f"{', '.join(parts)}; interpreter {self.interpreter}"


def _interpreters() -> list[str]:
    found = [sys.executable, getattr(sys, "_base_executable", "")]
    found += [shutil.which("python3", path=_ENV_PATH) or "", "/usr/bin/python3"]
    unique: list[str] = []
    for path in found:
        if path and os.path.exists(path) and path not in unique:
            unique.append(path)
    return unique


def _candidates() -> list[tuple[bool, bool, bool]]:
    """(drop_user, namespaces, mount) from strongest to weakest."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    has_unshare = shutil.which("unshare", path=_ENV_PATH) is not None
    has_mount = has_unshare and all(shutil.which(b, path=_ENV_PATH) for b in ("sh", "mount"))
    order = [(d, True, m) for d in (True, False) for m in (True, False)]
    order += [(True, False, False), (False, False, False)]
    return [
        (d, n, m)
        for d, n, m in order
        if (root or not d) and (has_unshare or not n) and (has_mount or not m)
    ]


def _try_layers(layers: Layers) -> bool:
    probe = "import socket\nprint(sum(range(5)))\n"
    try:
        result = _run(probe, layers, timeout=10.0, memory_mb=512, audit_hook=True)
    except OSError:
        return False
    return result.completed and result.stdout.strip() == "10"


@functools.lru_cache(maxsize=1)
def _detect() -> tuple[Layers | None, str]:
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


def sandbox_layers() -> Layers | None:
    """The strongest containment that works here, or None when none does."""
    return _detect()[0]


def sandbox_available() -> tuple[bool, str]:
    """``(True, description of the active layers)`` or ``(False, why not)``."""
    layers, reason = _detect()
    return (True, layers.describe()) if layers is not None else (False, reason)


def require_sandbox_for(tasks: Sequence[Task], remedy: str) -> None:
    """Refuse (before any generation) when ``tasks`` hold code tasks and no sandbox works:
    generated code is never run unsandboxed. ``remedy`` ends the one-line message."""
    if any(is_code_kind(t.verifier) for t in tasks):
        ok, reason = sandbox_available()
        if not ok:
            raise CdscopeError(
                f"cannot score code tasks: no sandbox here ({reason}); generated code is never "
                f"run unsandboxed - {remedy}"
            )


def _tail(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - MAX_OUTPUT_BYTES))
        return handle.read().decode("utf-8", "replace")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _run(
    program: str, layers: Layers, *, timeout: float, memory_mb: int, audit_hook: bool
) -> SandboxResult:
    marker = secrets.token_hex(16)
    workdir = tempfile.mkdtemp(prefix="cdscope-sandbox-")
    logs = tempfile.mkdtemp(prefix="cdscope-sandbox-log-")
    try:
        if layers.drop_user:
            os.chown(workdir, NOBODY, NOBODY)
        inside = MOUNT_WORKDIR if layers.mount else workdir  # the child's work dir
        settings = {
            "marker": marker,
            "program": program,
            "workdir": inside,
            "cpu_seconds": max(1, math.ceil(timeout)) + 1,
            "memory_mb": memory_mb,
            "file_size_mb": 16,
            "open_files": 64,
            "processes": 0,
            "audit_hook": audit_hook,
        }
        env = {"PATH": _ENV_PATH, "LANG": "C.UTF-8", "HOME": inside, "TMPDIR": inside}
        command: list[str] = []
        if layers.namespaces:
            command += [*_UNSHARE, *(("--mount",) if layers.mount else ()), "--"]
        if layers.mount:
            command += [shutil.which("sh", path=_ENV_PATH) or "/bin/sh", "-c", _MOUNT_SCRIPT]
        command += [layers.interpreter, "-I", "-S", "-B", "-c", _BOOTSTRAP.read_text("utf-8")]
        extra = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if layers.drop_user else {}
        out_path, err_path = Path(logs) / "stdout", Path(logs) / "stderr"
        start = time.perf_counter()
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
                close_fds=True,
                **extra,
            )
            timed_out = False
            try:
                proc.communicate(json.dumps(settings).encode("utf-8"), timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc.pid)  # also any straggler the program left behind
                proc.wait()
        seconds = time.perf_counter() - start
        stdout, stderr = _tail(out_path), _tail(err_path)
        completed = not timed_out and proc.returncode == 0 and f"\n{marker}\n" in stdout
        stdout = stdout.replace(f"\n{marker}\n", "")
        return SandboxResult(completed, proc.returncode, timed_out, stdout, stderr, seconds)
    finally:
        _remove(workdir)
        _remove(logs)


def _remove(path: str) -> None:
    def retry(function, target, _exc):  # a program may have made its files read-only
        try:
            os.chmod(target, 0o700)
            os.chmod(os.path.dirname(target), 0o700)
            function(target)
        except OSError:
            pass

    shutil.rmtree(path, onexc=retry) if sys.version_info >= (3, 12) else shutil.rmtree(
        path, onerror=retry
    )


def run_sandboxed(
    program: str, *, timeout: float, memory_mb: int = 512, audit_hook: bool = True
) -> SandboxResult:
    """Run ``program`` (Python source) in the sandbox; never in this process.

    ``timeout`` is wall-clock seconds for the whole run (the process group is killed
    after it); the CPU limit is the same, rounded up, plus one second. ``audit_hook=False``
    switches off the in-process layer only -- for tests of the OS layers underneath.
    Raises CdscopeError when no sandbox works here (code is then never run).
    """
    if timeout <= 0:
        raise CdscopeError(f"sandbox timeout must be positive, got {timeout}")
    if memory_mb < 64:
        raise CdscopeError(f"sandbox memory_mb must be at least 64, got {memory_mb}")
    layers, reason = _detect()
    if layers is None:
        raise CdscopeError(f"refusing to run generated code without a sandbox: {reason}")
    return _run(program, layers, timeout=timeout, memory_mb=memory_mb, audit_hook=audit_hook)
