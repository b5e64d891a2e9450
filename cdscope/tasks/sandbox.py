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
   interpreter's own prefix when it lives elsewhere), ``/dev/{null,zero,urandom}``, no
   ``/proc``, a private work dir (``MOUNT_WORKDIR``, its own tmpfs); the root is remounted
   read-only, ``chroot`` enters it and the interpreter starts with every capability
   dropped (``setpriv``; without CAP_SYS_CHROOT and with no ``/proc`` the chroot
   cannot be left). Task files, the repository, home directories and
   the parent's ``/proc`` are simply not there. This is the layer that *isolates
   files*: code tasks (``cdscope.tasks.harness``) run only where it works.
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

The child talks to the parent in frames (``sandbox_child``) over a descriptor of its
own; its stdout/stderr go to capped log files. No layer here decides a verdict: code
verdicts are the harness's, which keeps the tests in this process. What the layers do
not protect against is documented in docs/tasks.md (kernel exploits, CPU-cache side
channels, interpreter bugs that escape the audit hook).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import select
import shlex
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
from cdscope.tasks import sandbox_child as wire
from cdscope.tasks.format import Task, default_task_dir, is_code_kind

NOBODY = 65534
MAX_OUTPUT_BYTES = 64 * 1024  # of stdout/stderr kept for the result
_BOOTSTRAP = Path(__file__).with_name("sandbox_child.py")
_UNSHARE = ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")
MOUNT_WORKDIR = "/cdscope-work"  # inside the minimal root; its own tmpfs
_ROOT_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_TOOLS = ("sh", "mount", "chroot", "setpriv", "mkdir", "ln", "touch")
_ENV_PATH = "/usr/local/bin:/usr/bin:/bin"
_TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_HIDDEN = (Path(__file__).resolve().parents[2], default_task_dir().resolve(), Path.home())


def _mount_script(binds: Sequence[str]) -> str:
    """Run by /bin/sh in the new namespaces, then exec'd into the interpreter: build the
    minimal root (module docstring, layer 4), chroot into it, drop every capability
    (without CAP_SYS_CHROOT, and with no /proc, a chroot cannot be left)."""
    links, dirs = [], []
    for path in binds:
        if os.path.islink(path) and path.count("/") == 1:  # /bin -> usr/bin (usr-merge)
            target = os.readlink(path)
            if os.path.basename(target) == path[1:] and not target.startswith("/"):
                links.append(target)
        elif os.path.isdir(path):
            dirs.append(path)
    made = " ".join(shlex.quote("." + d) for d in dirs)
    binds_cmd = "".join(f"mount --bind -o ro {shlex.quote(d)} {shlex.quote('.' + d)}; " for d in dirs)
    link_cmd = f"ln -s {' '.join(shlex.quote(t) for t in links)} .; " if links else ""
    return (
        f"set -e; PATH={_TOOL_PATH}; mount -t tmpfs -o size=16m,mode=755 cdscope-root /tmp; "
        f"cd /tmp; mkdir -p dev .{MOUNT_WORKDIR} {made}; {binds_cmd}{link_cmd}"
        "touch dev/null dev/urandom; mount --bind /dev/null dev/null; "
        "mount --bind /dev/urandom dev/urandom; "
        f"mount -t tmpfs -o size=64m,mode=700 cdscope-work .{MOUNT_WORKDIR}; "
        "mount -o remount,bind,ro /tmp; "
        f"unset PWD OLDPWD; PATH={_ENV_PATH}; exec {_tool('chroot')} /tmp {_tool('setpriv')} "
        '--no-new-privs --inh-caps=-all --bounding-set=-all -- "$0" "$@"'
    )


def _tool(name: str) -> str:
    return shlex.quote(shutil.which(name, path=_TOOL_PATH) or name)


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


def exit_reason(stderr: str, returncode: int | None) -> str:
    """One line for a child that ended early: its last stderr line, or how it ended."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    if lines:
        return lines[-1]
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode} before the end of the program"


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
            "user+net+pid namespace (no network)" if self.namespaces else "NO network namespace"
        )
        if self.mount:
            parts.append("mount namespace (minimal read-only root, host files hidden)")
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


def _binds(interpreter: str) -> list[str]:
    """What the minimal root needs: the system dirs, plus the interpreter's prefix (both
    the path as called and the resolved one) when it lies outside them."""
    binds = list(_ROOT_DIRS)
    for path in (Path(interpreter).absolute(), Path(interpreter).resolve()):
        prefix = str(path.parents[1])
        if not any(prefix == d or prefix.startswith(d + "/") for d in binds) and prefix != "/":
            binds.append(prefix)
    return binds


def _candidates() -> list[tuple[bool, bool, bool]]:
    """(drop_user, namespaces, mount) from strongest to weakest."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    has_unshare = shutil.which("unshare", path=_ENV_PATH) is not None
    has_mount = has_unshare and all(shutil.which(b, path=_TOOL_PATH) for b in _TOOLS)
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
        hidden = [str(p) for p in _HIDDEN if str(p) != "/"]
        probe += f"import os\nassert not any(os.path.exists(p) for p in {hidden!r})\n"
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


def _tail(path: Path) -> str:
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - MAX_OUTPUT_BYTES))
        return handle.read().decode("utf-8", "replace")


class SandboxTimeout(Exception):
    """The child's deadline passed."""


class SandboxClosed(Exception):
    """The child ended (or closed its frame descriptor) before answering."""


class SandboxProcess:
    """One started sandbox child: settings sent, frames exchanged under one deadline;
    ``close()`` kills its process group and removes its directories (use ``with``)."""

    def __init__(self, layers: Layers, settings: dict, *, timeout: float, memory_mb: int):
        self.start = time.perf_counter()
        self.deadline = time.monotonic() + timeout
        self.stdout = self.stderr = ""
        self.returncode: int | None = None
        self._workdir = tempfile.mkdtemp(prefix="cdscope-sandbox-")
        self._logs = Path(tempfile.mkdtemp(prefix="cdscope-sandbox-log-"))
        self._reader, writer = os.pipe()
        try:
            if layers.drop_user:
                os.chown(self._workdir, NOBODY, NOBODY)
            inside = MOUNT_WORKDIR if layers.mount else self._workdir
            settings = {
                **settings,
                "workdir": inside,
                "result_fd": writer,
                "cpu_seconds": max(1, math.ceil(timeout)) + 1,
                "memory_mb": memory_mb,
                "file_size_mb": 16,
                "open_files": 64,
                "processes": 0,
            }
            env = {"PATH": _ENV_PATH, "LANG": "C.UTF-8", "HOME": inside, "TMPDIR": inside}
            command: list[str] = []
            if layers.namespaces:
                command += [*_UNSHARE, *(("--mount",) if layers.mount else ()), "--"]
            if layers.mount:
                script = _mount_script(_binds(layers.interpreter))
                command += [shutil.which("sh", path=_ENV_PATH) or "/bin/sh", "-c", script]
            command += [layers.interpreter, "-I", "-S", "-B", "-c", _BOOTSTRAP.read_text("utf-8")]
            user = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
            with open(self._logs / "stdout", "wb") as out, open(self._logs / "stderr", "wb") as err:
                self.proc = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    cwd=self._workdir,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=(writer,),
                    **(user if layers.drop_user else {}),
                )
        except BaseException:
            os.close(self._reader)
            self._remove_dirs()
            raise
        finally:
            os.close(writer)
        assert self.proc.stdin is not None
        self._stdin = self.proc.stdin.fileno()
        os.set_blocking(self._stdin, False)
        try:
            self.send(settings)
        except BaseException:
            self.close()
            raise

    def _wait(self, fd: int, writing: bool) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SandboxTimeout
        ready = select.select([], [fd], [], left) if writing else select.select([fd], [], [], left)
        if not any(ready):
            raise SandboxTimeout

    def send(self, message: object) -> None:
        """Write one frame to the child's stdin (SandboxClosed when it stopped reading)."""
        data = wire.pack(message)
        while data:
            self._wait(self._stdin, writing=True)
            try:
                data = data[os.write(self._stdin, data) :]
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError) as exc:
                raise SandboxClosed(str(exc)) from None

    def _read(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            self._wait(self._reader, writing=False)
            chunk = os.read(self._reader, min(left, 1 << 20))
            if not chunk:
                raise SandboxClosed("the child ended")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def receive(self) -> object:
        """The child's next frame (SandboxTimeout, SandboxClosed or wire.WireError)."""
        return wire.unpack(self._read(wire.frame_length(self._read(4))))

    def close(self) -> None:
        """Kill the child's process group (stragglers too), collect its output, clean up."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        self.returncode = self.proc.wait()
        os.close(self._reader)
        self.stdout, self.stderr = _tail(self._logs / "stdout"), _tail(self._logs / "stderr")
        self._remove_dirs()

    def _remove_dirs(self) -> None:
        _remove(self._workdir)
        _remove(str(self._logs))

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    ``sandbox_child``); only where the files-isolating layer works (CdscopeError else)."""
    layers = _check_settings(timeout, memory_mb)
    ok, reason = code_sandbox_available()
    if not ok:
        raise CdscopeError(f"refusing to run generated code for a code task: {reason}")
    settings = {"program": program, "entry_point": entry_point, "audit_hook": True}
    return SandboxProcess(layers, settings, timeout=timeout, memory_mb=memory_mb)
