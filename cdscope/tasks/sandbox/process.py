"""One sandboxed child process: how it is started (the layers' command line and the
minimal root's mount script) and how frames are exchanged with it under a deadline.

``layers`` describes the layers and decides which work here; this module
only carries out a given ``Layers``. Frames are ``child``'s wire format.
"""

from __future__ import annotations

import contextlib
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

from cdscope.resources import default_probe_dir, default_task_dir
from cdscope.tasks.sandbox import child as wire

NOBODY = 65534
MAX_OUTPUT_BYTES = 64 * 1024  # of stdout/stderr kept for the result
_BOOTSTRAP = Path(__file__).with_name("child.py")
_UNSHARE = ("unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child")
MOUNT_WORKDIR = "/cdscope-work"  # inside the minimal root; its own tmpfs
_ROOT_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ENV_PATH = "/usr/local/bin:/usr/bin:/bin"
TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def data_dirs() -> list[str]:
    """The shipped data -- pools and task sets, whose code tests are what a candidate must
    never read -- wherever this install keeps it (package data, or ``$CDSCOPE_*``)."""
    found = {str(folder().resolve()) for folder in (default_task_dir, default_probe_dir)}
    found.add(str(Path(__file__).resolve().parents[2] / "data"))
    return sorted(p for p in found if os.path.isdir(p))


def _mount_script(binds: Sequence[str], masks: Sequence[str] = ()) -> str:
    """Run by /bin/sh in the new namespaces, then exec'd into the interpreter: build the
    minimal root (module docstring, layer 4), chroot into it, drop every capability
    (without CAP_SYS_CHROOT, and with no /proc, a chroot cannot be left). ``masks``
    that lie inside a bound dir (cdscope installed under /usr or inside the
    interpreter's prefix) are covered by an empty read-only tmpfs."""
    links, dirs = [], []
    for path in binds:
        if os.path.islink(path) and path.count("/") == 1:  # /bin -> usr/bin (usr-merge)
            target = os.readlink(path)
            if os.path.basename(target) == path[1:] and not target.startswith("/"):
                links.append(target)
        elif os.path.isdir(path):
            dirs.append(path)
    made = " ".join(shlex.quote("." + d) for d in dirs)
    binds_cmd = "".join(
        f"mount --bind -o ro {shlex.quote(d)} {shlex.quote('.' + d)}; " for d in dirs
    )
    link_cmd = f"ln -s {' '.join(shlex.quote(t) for t in links)} .; " if links else ""
    inside = [m for m in masks if any(m == d or m.startswith(d + "/") for d in dirs)]
    binds_cmd += "".join(
        f"mount -t tmpfs -o size=4k,mode=555,ro cdscope-mask {shlex.quote('.' + m)}; "
        for m in inside
    )
    return (
        f"set -e; PATH={TOOL_PATH}; mount -t tmpfs -o size=16m,mode=755 cdscope-root /tmp; "
        f"cd /tmp; mkdir -p dev .{MOUNT_WORKDIR} {made}; {binds_cmd}{link_cmd}"
        ": > dev/null; : > dev/urandom; mount --bind /dev/null dev/null; "
        "mount --bind /dev/urandom dev/urandom; "
        f"mount -t tmpfs -o size=64m,mode=700 cdscope-work .{MOUNT_WORKDIR}; "
        "mount -o remount,bind,ro /tmp; "
        f"unset PWD OLDPWD; PATH={ENV_PATH}; exec {_tool('chroot')} /tmp {_tool('setpriv')} "
        '--no-new-privs --inh-caps=-all --bounding-set=-all -- "$0" "$@"'
    )


def _tool(name: str) -> str:
    return shlex.quote(shutil.which(name, path=TOOL_PATH) or name)


def how_it_ended(returncode: int | None) -> str:
    """How a child ended, as the operating system reports it ("killed by SIGXCPU")."""
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode} before the end of the program"


def exit_reason(stderr: str, returncode: int | None) -> str:
    """One line for a ``run_sandboxed`` child that ended early: its last stderr line, or
    how it ended (code verdicts never use the child's output: ``harness.ended_early``)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else how_it_ended(returncode)


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


def host_binds(interpreter: str) -> list[str]:
    """What the minimal root needs: the system dirs, plus the interpreter's prefix (both
    the path as called and the resolved one) when it lies outside them."""
    binds = list(_ROOT_DIRS)
    for path in (Path(interpreter).absolute(), Path(interpreter).resolve()):
        prefix = str(path.parents[1])
        if not any(prefix == d or prefix.startswith(d + "/") for d in binds) and prefix != "/":
            binds.append(prefix)
    return binds


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
            env = {"PATH": ENV_PATH, "LANG": "C.UTF-8", "HOME": inside, "TMPDIR": inside}
            command: list[str] = []
            if layers.namespaces:
                command += [*_UNSHARE, *(("--mount",) if layers.mount else ()), "--"]
            if layers.mount:
                script = _mount_script(host_binds(layers.interpreter), data_dirs())
                command += [shutil.which("sh", path=ENV_PATH) or "/bin/sh", "-c", script]
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
        poller = select.poll()  # not select(): descriptors above 1023 are common in training
        poller.register(fd, select.POLLOUT if writing else select.POLLIN)
        if not poller.poll(math.ceil(left * 1000)):
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
        """The child's next frame (SandboxTimeout, SandboxClosed or wire.WireError). The
        deadline covers parsing too: a frame read after it is not parsed, one parsed after
        it is late, and what one parse may cost is bounded (``wire.MAX_VALUES``)."""
        body = self._read(wire.frame_length(self._read(4)))
        if time.monotonic() > self.deadline:
            raise SandboxTimeout
        message = wire.unpack(body, max_values=wire.MAX_VALUES)
        if time.monotonic() > self.deadline:
            raise SandboxTimeout
        return message

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
