"""The trusted bootstrap of a sandboxed run: its source is passed as ``python -I -S -c``.

It runs before any untrusted code, inside the child process the parent started
(``cdscope.tasks.sandbox``): it reads its settings and the program from stdin (JSON),
starts the (idle) worker thread, sets the resource limits, moves into the fresh
temporary directory, installs the audit hook, and lets the worker execute the program
as ``__main__``. If the program raises (SystemExit included) the worker reports it and
ends the process with exit code 3. Only if the worker returns -- the program ran to its
end -- does the main thread print the run's secret marker, which is how the parent
tells a pass from ``os._exit(0)``. The marker lives only in the main thread's frame,
which no frame reachable from the worker leads to; the frame/GC introspection that
could find it is refused by the hook. Standard library only; never imports cdscope
(the child may run another interpreter, as another user).
"""

# Executed as a script: no ``from __future__`` and no cdscope imports here.
import contextlib
import json
import os
import resource
import sys
import threading
import time
import types

# PEP 578 audit events refused outright.
BLOCKED_EVENTS = frozenset(
    {
        "os.system",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "os.putenv",
        "os.unsetenv",
        "os.setuid",
        "os.setgid",
        "signal.pthread_kill",
        "pty.spawn",
        "sys._current_frames",
        "sys._current_exceptions",
        "sys.setprofile",
        "sys.settrace",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "_thread.start_new_thread",
        "webbrowser.open",
    }
)
BLOCKED_PREFIXES = ("os.exec", "os.spawn", "os.posix_spawn", "subprocess.", "socket.", "ctypes.")
BLOCKED_IMPORTS = frozenset(
    {"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing"}
)
# Events whose first two arguments, when paths, must lie inside the work dir.
PATH_EVENTS = frozenset(
    {
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.link",
        "os.symlink",
        "os.truncate",
        "os.utime",
        "os.setxattr",
        "os.removexattr",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.move",
    }
)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _set_limits(settings):
    memory = int(settings["memory_mb"]) * 1024 * 1024
    limits = [
        (resource.RLIMIT_CPU, int(settings["cpu_seconds"])),
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_DATA, memory),
        (resource.RLIMIT_FSIZE, int(settings["file_size_mb"]) * 1024 * 1024),
        (resource.RLIMIT_NOFILE, int(settings["open_files"])),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NPROC, int(settings["processes"])),
    ]
    for kind, value in limits:
        _, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(kind, (value, value))


def _make_hook(root):
    """The audit hook. Everything it uses is bound here, so rebinding module globals or
    monkeypatching ``os.path`` from the program does not change what it checks; paths
    are normalised lexically (symlinks out of the work dir cannot be made: os.symlink
    is a checked event)."""
    getcwd, fsdecode, fspath = os.getcwd, os.fsdecode, os.fspath
    is_instance, text, perm = isinstance, str, PermissionError
    blocked, prefixes, imports, path_events = (
        BLOCKED_EVENTS,
        BLOCKED_PREFIXES,
        BLOCKED_IMPORTS,
        PATH_EVENTS,
    )
    write_flags = WRITE_FLAGS
    root = "/" + "/".join(p for p in root.split("/") if p)

    def norm(path):
        path = fsdecode(fspath(path))
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        parts = []
        for part in path.split("/"):
            if part in ("", "."):
                continue
            if part == "..":
                if parts:
                    parts.pop()
            else:
                parts.append(part)
        return "/" + "/".join(parts)

    def inside(path):
        if is_instance(path, int):
            return True  # an already open descriptor (stdout/stderr)
        real = norm(path)
        return real == root or real.startswith(root + "/")

    def hook(event, args):
        if event in blocked or event.startswith(prefixes):
            raise perm(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].split(".")[0] in imports:
            raise perm(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            if not is_instance(path, int):
                real = norm(path)
                if real == "/proc" or real.startswith(("/proc/", "/sys/")):
                    raise perm(f"sandbox: opening {real} is not allowed")
            writing = any(c in text(mode or "") for c in "wax+") or bool((flags or 0) & write_flags)
            if writing and not inside(path):
                raise perm(f"sandbox: writing {path!r} outside the work dir")
        elif event in path_events:
            for path in args[:2]:
                if is_instance(path, (str, bytes, os.PathLike)) and not inside(path):
                    raise perm(f"sandbox: {event} {path!r} outside the work dir")

    return hook


def _describe(exc):
    """``Type: message (line N)``, N the program's last line in the traceback."""
    tb = exc.__traceback__
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<program>":
            line = tb.tb_lineno
        tb = tb.tb_next
    text = f"{type(exc).__name__}: {exc}".rstrip(": ").strip()
    return f"{text} (line {line})" if line is not None else text


def _flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):  # the program may have replaced them
            stream.flush()


def _fail(message):
    _flush()
    os.write(2, ("\n" + message + "\n").encode("utf-8", "replace"))
    os._exit(3)


def _worker(code, namespace, go, write=os.write, exit=os._exit, describe=_describe):
    """Run the program; on any exception end the whole process (exit code 3).

    ``write``/``exit``/``describe`` are bound when the thread starts, so the program
    cannot swap them; whatever ``describe`` (which runs the exception's ``__str__``)
    does, the process exits unless it loops (then the parent's timeout kills it)."""
    go.wait()
    try:
        exec(code, namespace)
    except BaseException as exc:  # SystemExit too: only a normal return counts
        message = "the program raised an exception that cannot be shown"
        try:
            _flush()
            message = describe(exc)
        finally:
            try:
                write(2, ("\n" + message + "\n").encode("utf-8", "replace"))
            finally:
                exit(3)


def main(write=os.write, exit=os._exit, listdir=os.listdir, sleep=time.sleep):
    settings = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdin.close()
    marker = settings.pop("marker")
    try:
        code = compile(settings.pop("program"), "<program>", "exec")
    except (SyntaxError, ValueError) as exc:
        _fail(_describe(exc))
    tasks = f"/proc/{os.getpid()}/task"
    module = types.ModuleType("__main__")
    go = threading.Event()
    worker = threading.Thread(target=_worker, args=(code, module.__dict__, go), daemon=True)
    worker.start()  # before RLIMIT_NPROC = 0 forbids new threads
    _set_limits(settings)
    os.chdir(settings["workdir"])
    os.umask(0o077)
    sys.modules["__main__"] = module
    if settings["audit_hook"]:
        sys.addaudithook(_make_hook(settings["workdir"]))
    del settings, code, module
    go.set()
    # Wait for the worker's kernel thread itself to be gone: Python-level join state is
    # reachable (and so forgeable) from the program, the kernel's task list is not. A
    # failing program never gets here: its worker ends the process with exit code 3.
    while len(listdir(tasks)) > 1:
        sleep(0.002)
    _flush()
    write(1, ("\n" + marker + "\n").encode())
    exit(0)


if __name__ == "__main__":  # run as ``python -c``; importing it does nothing
    main()
