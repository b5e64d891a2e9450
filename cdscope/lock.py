"""One writer per output: an advisory lock on a file beside it.

``OutputLock(target)`` locks ``.NAME.lock`` in the target's folder with ``fcntl.lockf`` —
POSIX record locks, which Linux and macOS honour on local file systems and over NFS
(lockd / NFSv4 leases) alike — and records the holder (pid, host, command line, start
time) in it. A second writer gets one line naming the holder and exits 2; it never waits.

Stale locks: a kernel lock dies with its process (``kill -9`` included; on NFS when the
client's lease lapses), so the lock file a killed run leaves behind holds no lock and the
next run takes it over. Where the file system refuses record locks (``ENOLCK``,
``EOPNOTSUPP``: some FUSE and SMB mounts), the lock is the file's exclusive creation
instead; such a file is stale when its holder ran on this host and is gone, and a holder
on another host must be cleared by hand (the message names the file to delete).

POSIX locks belong to a process, not to a file descriptor, so a second lock taken by the
same process would succeed silently: ``_HELD`` refuses it (two writers in one Python
process, e.g. two threads of the API). Releasing removes the file while still holding
the lock; a process that opened the same file before the removal finds, once it holds
the lock, that the path no longer names its file, and tries again on the new one.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import shlex
import socket
import sys
import threading
from pathlib import Path

from cdscope.errors import CdscopeError
from cdscope.io import WriteFailed, failure_reason, make_parents, remove_empty

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the exclusive-creation lock only
    fcntl = None  # type: ignore[assignment]

#: lock errors that mean "this file system has no record locks" (use exclusive creation)
_NO_RECORD_LOCKS = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_HELD: set[str] = set()  # lock files held by this process
_HELD_GUARD = threading.Lock()


class OutputBusy(CdscopeError):
    """Another run holds the lock of this output."""


def lock_path(target: Path) -> Path:
    """``results/probe.parquet`` -> ``results/.probe.parquet.lock``."""
    return target.parent / f".{target.name}.lock"


def _holder_record() -> dict:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started_utc": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "command_line": shlex.join(["cdscope", *sys.argv[1:]]) if sys.argv else "",
    }


def _read_holder(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


def _describe(holder: dict) -> str:
    if not holder.get("pid"):
        return "another run (holder unknown)"
    since = f", since {holder['started_utc']}" if holder.get("started_utc") else ""
    return f"pid {holder['pid']} on {holder.get('host', '?')}{since}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class OutputLock:
    """The lock of one output path (a file or a folder); a context manager."""

    def __init__(self, target: str | Path) -> None:
        self.target = Path(target)
        self.path = lock_path(self.target)
        self._fd: int | None = None
        self._key = ""
        self._made: list[Path] = []  # folders acquire created: removed on release if empty

    def _busy(self, holder: dict, extra: str = "") -> OutputBusy:
        return OutputBusy(
            f"{self.target} is being written by another cdscope run ({_describe(holder)}); "
            f"wait for it to finish or choose another output{extra}"
        )

    def acquire(self) -> OutputLock:
        """Take the lock or raise ``OutputBusy`` (one line naming the holder).

        A folder or lock file that cannot be made or written (a full disk, a read-only
        file system, no permission) is one ``WriteFailed`` line naming the output; the
        lock file and the folders made for it are removed again."""
        try:
            self._made = make_parents(self.path)
        except OSError as exc:
            raise WriteFailed(self.target, failure_reason(exc)) from None
        self._key = str(self.path.resolve())
        with _HELD_GUARD:
            if self._key in _HELD:
                raise self._busy({"pid": os.getpid(), "host": socket.gethostname()},
                                 " (a second writer in the same process)")  # fmt: skip
            _HELD.add(self._key)
        try:
            self._fd = self._record_lock() if fcntl is not None else None
            if self._fd is None:
                self._fd = self._exclusive_file()
            record = json.dumps(_holder_record()).encode()
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, record, 0)
        except BaseException as exc:
            self._give_up()
            if isinstance(exc, OSError):
                raise WriteFailed(self.target, failure_reason(exc)) from None
            raise
        return self

    def _give_up(self) -> None:
        """A failed ``acquire``: what ``release`` does (the lock file removed if it is ours),
        also when no lock file was opened."""
        if self._fd is not None:
            self.release()
            return
        with _HELD_GUARD:
            _HELD.discard(self._key)
        remove_empty(self._made)

    def _record_lock(self) -> int | None:
        """The fd holding a ``lockf`` lock on ``self.path``; None when the file system has
        no record locks."""
        for _ in range(16):  # retried only when a releasing run removed the file under us
            created = not self.path.exists()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in _NO_RECORD_LOCKS:
                    if created:  # the exclusive creation below must find no file of ours
                        self.path.unlink(missing_ok=True)
                    return None
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    raise self._busy(_read_holder(self.path)) from None
                raise CdscopeError(f"cannot lock {self.path}: {exc.strerror or exc}") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                return fd
            os.close(fd)
        raise CdscopeError(f"cannot lock {self.path}: it keeps being replaced")

    def _exclusive_file(self) -> int:
        """The lock as exclusive creation of ``self.path`` (no record locks here)."""
        for _ in range(2):
            try:
                return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                holder = _read_holder(self.path)
                pid = holder.get("pid")
                stale = (
                    isinstance(pid, int)
                    and pid > 0
                    and holder.get("host") == socket.gethostname()
                    and not _alive(pid)
                )
                if not stale:
                    raise self._busy(
                        holder,
                        f"; if that run is gone, delete {self.path} (this file system has no "
                        "record locks, so a lock from another host cannot be checked)",
                    ) from None
                self.path.unlink(missing_ok=True)  # its holder on this host is gone
        raise self._busy(_read_holder(self.path))

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def release(self) -> None:
        """Remove the lock file (if it is still ours), then drop the lock."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(self._fd), os.stat(self.path)):
                self.path.unlink()
        self._close()
        with _HELD_GUARD:
            _HELD.discard(self._key)
        remove_empty(self._made)  # a run that wrote nothing leaves no empty folder behind

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> OutputLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
