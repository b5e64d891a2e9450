"""The trusted bootstrap of a sandboxed run, and the wire format both sides speak.

Run as ``python -I -S -B -c <this source>`` in the child (``cdscope.tasks.sandbox``): it
reads its settings (one frame on stdin), sets the resource limits, enters the work dir,
installs the audit hook and executes the program as ``__main__``. Without an
``entry_point`` (``run_sandboxed``) it then sends ``{"done": true}``; with one (a code
task's candidate) it sends ``{"ready": true}`` and answers each request ``{"a": args,
"k": kwargs}`` with ``{"r": value}``, ``{"x": [exception type, message]}`` or ``{"bad":
why}`` (not plain data) until stdin closes. Nothing here decides a verdict: the child
holds no secret, and any frame it writes the program could have written itself; the
parent (``cdscope.tasks.sandbox.harness``) runs the tests and only takes plain data back.
Frames go to a descriptor of their own; the program's stdout/stderr go to log files.

Wire format (imported by the parent too): a 4-byte big-endian length, then ASCII JSON.
Values are tagged so types survive: ``None``, ``bool``, ``int``, ``float`` (nan/inf),
``str``, ``list`` as themselves; ``{"t": [...]}`` tuple, ``{"s": [...]}`` set, ``{"f":
[...]}`` frozenset, ``{"d": [[k, v], ...]}`` dict. Only those exact types encode (an
always-equal ``int`` subclass is not data); decoding never runs user code and is bounded
(``MAX_FRAME``, ``MAX_VALUES`` counted before parsing, ``MAX_DEPTH``, ``MAX_HASHED``,
``MAX_SAME_HASH`` -- no set or dict is
built before its elements' hashes are checked --, Python's 4300-digit int limit, and a
deadline checked while decoding). Standard
library only, never imports cdscope (the child may run another interpreter, in a root
where cdscope is not visible).
"""

# Executed as a script: no ``from __future__`` and no cdscope imports here.
import contextlib
import json
import os
import resource
import stat
import struct
import sys
import time
import types

_monotonic = time.monotonic

MAX_FRAME = 8 * 1024 * 1024
MAX_VALUES = 1 << 18  # JSON values in a frame the parent parses (a reply)
MAX_DEPTH = 64
MAX_HASHED = 4096  # set elements / dict keys per value
MAX_SAME_HASH = 16  # elements sharing one hash: bounds hash-collision work in the parent
CHECK_EVERY = 1024  # decoded nodes between deadline checks
_HEADER = struct.Struct(">I")
_SIMPLE = (bool, int, float, str)

# PEP 578 audit events refused outright.
BLOCKED_EVENTS = frozenset(
    [
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
        "_thread.start_new_thread",
        "webbrowser.open",
    ]  # noqa: SIM905
)
BLOCKED_PREFIXES = ("os.exec", "os.spawn", "os.posix_spawn", "subprocess.", "socket.", "ctypes.")
BLOCKED_IMPORTS = frozenset(
    {"ctypes", "_ctypes", "_posixsubprocess", "multiprocessing", "_multiprocessing"}
)
# Events that change files: (positions of paths that must resolve inside the work dir,
# positions of dir_fd arguments that must be None -- a descriptor of another directory
# would make a relative path mean something the hook cannot see).
PATH_EVENTS = {
    **dict.fromkeys(("os.truncate", "os.setxattr", "os.removexattr"), ((0,), ())),
    **dict.fromkeys(("os.remove", "os.rmdir", "shutil.rmtree"), ((0,), (1,))),
    **dict.fromkeys(("os.mkdir", "os.chmod"), ((0,), (2,))),
    **dict.fromkeys(("os.chown", "os.utime"), ((0,), (3,))),
    **dict.fromkeys(("os.rename", "os.link"), ((0, 1), (2, 3))),
    **dict.fromkeys(("shutil.copyfile", "shutil.move"), ((0, 1), ())),
    "os.symlink": ((1,), (2,)),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class WireError(ValueError):
    """A value that is not plain data, or a malformed frame."""


class WireTimeout(WireError):
    """The deadline passed while a value was being decoded."""


# -- wire format ----------------------------------------------------------------------
def encode(value, depth=0):
    """``value`` as tagged JSON-able data; WireError when it is not plain data."""
    kind = type(value)
    if value is None or kind in _SIMPLE:
        return value
    if depth >= MAX_DEPTH:
        raise WireError(f"a value nested deeper than {MAX_DEPTH} levels")
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"t": [encode(v, depth + 1) for v in value]}
    if kind is set or kind is frozenset:
        return {"s" if kind is set else "f": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise WireError(f"a {kind.__name__} is not plain data")


def _check_hashes(elements):
    """Refuse hash-flooding before any set or dict is built from untrusted elements: the
    hashes are sorted (no hashing of hashes) and at most ``MAX_SAME_HASH`` may be equal,
    so building the set costs O(n * MAX_SAME_HASH) comparisons, not O(n**2)."""
    try:
        hashes = sorted(hash(e) for e in elements)
    except TypeError as exc:  # an unhashable key or element
        raise WireError(str(exc)) from None
    run = 1
    for index in range(1, len(hashes)):
        run = run + 1 if hashes[index] == hashes[index - 1] else 1
        if run > MAX_SAME_HASH:
            raise WireError(f"more than {MAX_SAME_HASH} set elements or dict keys with one hash")


class _Budget:
    """What one value's decoding may still spend: hashed elements, and a deadline
    (``time.monotonic`` seconds, checked every ``CHECK_EVERY`` nodes)."""

    def __init__(self, deadline=None):
        self.hashed, self.nodes, self.deadline = 0, 0, deadline

    def node(self):
        self.nodes += 1
        due = self.deadline is not None and self.nodes % CHECK_EVERY == 0
        if due and _monotonic() > self.deadline:
            raise WireTimeout("the deadline passed while decoding")


def decode(data, depth=0, budget=None, deadline=None):
    """The value of tagged data (as ``json.loads`` returns it); WireError when malformed,
    WireTimeout when ``deadline`` (``time.monotonic`` seconds) passes while decoding."""
    budget = _Budget(deadline) if budget is None else budget
    budget.node()
    kind = type(data)
    if data is None or kind in _SIMPLE:
        return data
    if depth >= MAX_DEPTH:
        raise WireError(f"a value nested deeper than {MAX_DEPTH} levels")
    if kind is list:
        return [decode(v, depth + 1, budget) for v in data]
    if kind is not dict or len(data) != 1:
        raise WireError("a malformed value")
    ((tag, items),) = data.items()
    if type(items) is not list:
        raise WireError("a malformed value")
    if tag == "t":
        return tuple(decode(v, depth + 1, budget) for v in items)
    if tag not in ("s", "f", "d"):
        raise WireError(f"an unknown tag {tag!r}")
    budget.hashed += len(items)
    if budget.hashed > MAX_HASHED:
        raise WireError(f"more than {MAX_HASHED} set elements or dict keys")
    if tag == "d":
        if any(type(p) is not list or len(p) != 2 for p in items):
            raise WireError("a malformed dict")
        keys = [decode(k, depth + 1, budget) for k, _ in items]
        values = [decode(v, depth + 1, budget) for _, v in items]
        _check_hashes(keys)
        return dict(zip(keys, values, strict=True))
    elements = [decode(v, depth + 1, budget) for v in items]
    _check_hashes(elements)
    return set(elements) if tag == "s" else frozenset(elements)


def pack(message):
    """One frame: length header + ASCII JSON (WireError when too large or unencodable)."""
    try:
        body = json.dumps(message, separators=(",", ":")).encode("ascii")
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. an int over 4300 digits
        raise WireError(str(exc)) from None
    if len(body) > MAX_FRAME:
        raise WireError(f"a frame larger than {MAX_FRAME} bytes")
    return _HEADER.pack(len(body)) + body


def frame_length(header):
    """The body length announced by a 4-byte header (WireError when over ``MAX_FRAME``)."""
    (length,) = _HEADER.unpack(header)
    if length > MAX_FRAME:
        raise WireError(f"a frame larger than {MAX_FRAME} bytes")
    return length


def unpack(body, max_values=None):
    """The JSON message of a frame body (WireError when it is not valid JSON). With
    ``max_values``, a body holding more JSON values than that -- counted from its commas
    and openings before anything is parsed, an upper bound -- is refused unparsed: an
    8 MiB frame of ``[],[],…`` took the parent a second and 200 MiB to parse."""
    if max_values is not None:
        values = body.count(b",") + body.count(b"[") + body.count(b"{") + 1
        if values > max_values:
            raise WireError(f"a frame of more than {max_values} values")
    try:
        return json.loads(body.decode("ascii"))
    except (ValueError, RecursionError) as exc:
        raise WireError(f"a malformed frame ({exc})") from None


# -- the child ------------------------------------------------------------------------
def _read_exact(fd, size, read=os.read):
    chunks, left = [], size
    while left:
        chunk = read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd=0):
    header = _read_exact(fd, 4)
    if header is None:
        return None
    body = _read_exact(fd, frame_length(header))
    return None if body is None else unpack(body)


def _send(fd, message, write=os.write):
    data = pack(message)
    while data:
        data = data[write(fd, data) :]


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
    monkeypatching ``os``/``os.path`` from the program does not change what it checks.
    Paths are resolved the way the kernel does (symlinks followed, ``..`` after them),
    directory descriptors cannot be opened (so ``dir_fd`` cannot point elsewhere) and
    only ``str``/``bytes``/descriptor paths or untouched ``pathlib`` paths are accepted
    (a custom ``__fspath__`` could answer differently to the hook and to ``open``)."""
    import pathlib

    getcwd, fsdecode, fspath = os.getcwd, os.fsdecode, os.fspath
    lstat, readlink, is_link, is_dir = os.lstat, os.readlink, stat.S_ISLNK, stat.S_ISDIR
    is_instance, text, perm, kind_of = isinstance, str, PermissionError, type
    pure = pathlib.PurePath
    path_types = (pathlib.PosixPath, pathlib.PurePosixPath)
    originals = (pure.__fspath__, pure.__str__)
    blocked, prefixes, imports, path_events = (
        BLOCKED_EVENTS,
        BLOCKED_PREFIXES,
        BLOCKED_IMPORTS,
        PATH_EVENTS,
    )
    write_flags = WRITE_FLAGS

    def resolve(path):
        kind = kind_of(path)
        untouched = kind in path_types and (pure.__fspath__, pure.__str__) == originals
        if kind not in (text, bytes) and not untouched:
            raise perm(f"sandbox: a path of type {kind.__name__} is not allowed")
        path = fsdecode(fspath(path))
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        pending = [p for p in reversed(path.split("/")) if p]
        parts, hops = [], 0
        while pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            here = "/" + "/".join([*parts, part])
            try:
                mode = lstat(here).st_mode
            except (OSError, ValueError):
                parts.append(part)  # does not exist (yet): nothing to follow
                continue
            if not is_link(mode):
                parts.append(part)
                continue
            hops += 1
            if hops > 40:
                raise perm("sandbox: too many levels of symbolic links")
            target = readlink(here)
            if target.startswith("/"):
                parts = []
            pending.extend(p for p in reversed(target.split("/")) if p)
        return "/" + "/".join(parts)

    root = resolve(root)

    def inside(path):
        if is_instance(path, int):
            return True  # an already open (checked) descriptor
        real = resolve(path)
        return real == root or real.startswith(root + "/")

    def hook(event, args):
        if event in blocked or event.startswith(prefixes):
            raise perm(f"sandbox: {event} is not allowed")
        if event == "import" and args[0].split(".")[0] in imports:
            raise perm(f"sandbox: importing {args[0]} is not allowed")
        if event == "open":
            path, mode, flags = args
            if is_instance(path, int):
                return
            real = resolve(path)
            if real == "/proc" or real.startswith(("/proc/", "/sys/")):
                raise perm(f"sandbox: opening {real} is not allowed")
            if mode is None:  # os.open: never a descriptor of a directory (dir_fd)
                try:
                    directory = is_dir(lstat(real).st_mode)
                except (OSError, ValueError):
                    directory = False
                if directory:
                    raise perm(f"sandbox: opening the directory {real} is not allowed")
            writing = any(c in text(mode or "") for c in "wax+") or bool((flags or 0) & write_flags)
            if writing and not inside(path):
                raise perm(f"sandbox: writing {path!r} outside the work dir")
        elif event in path_events:
            paths, dir_fds = path_events[event]
            for position in dir_fds:
                if position < len(args) and args[position] is not None:
                    raise perm(f"sandbox: {event} with dir_fd is not allowed")
            for position in paths:
                if position < len(args) and not inside(args[position]):
                    raise perm(f"sandbox: {event} {args[position]!r} outside the work dir")

    return hook


def describe(exc, filename="<program>", label="line"):
    """``Type: message (line N)``, N the last line of ``filename`` in the traceback."""
    tb = exc.__traceback__
    line = getattr(exc, "lineno", None) if isinstance(exc, SyntaxError) else None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    text = f"{type(exc).__name__}: {exc}".rstrip(": ").strip()
    return f"{text} ({label} {line})" if line is not None else text


def _safe_describe(exc, label="line"):
    try:  # the exception's __str__ is the program's code
        return describe(exc, label=label)
    except BaseException:
        return f"{type(exc).__name__} (its message cannot be shown)"


def _flush():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(BaseException):  # the program may have replaced them
            stream.flush()


def _fail(fd, message, write=os.write, exit=os._exit):
    _flush()
    write(2, ("\n" + message + "\n").encode("utf-8", "replace"))
    try:
        _send(fd, {"error": message})
    finally:
        exit(3)


def _serve(fd, function):
    """Answer call frames on stdin until it closes (see the module docstring)."""
    while True:
        request = _receive(0)
        if request is None:
            return
        args, kwargs = decode(request["a"]), decode(request["k"])
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:  # SystemExit too: the tests see a raised exception
            reply = {"x": [type(exc).__name__, _safe_describe(exc, "program line")]}
        else:
            try:
                reply = {"r": encode(value)}
                pack(reply)
            except (WireError, RecursionError) as exc:
                reply = {"bad": str(exc)}
        _flush()
        _send(fd, reply)


def main(exit=os._exit):
    settings = _receive(0)
    fd = int(settings["result_fd"])
    try:
        code = compile(settings.pop("program"), "<program>", "exec")
    except (SyntaxError, ValueError) as exc:
        _fail(fd, describe(exc))
    _set_limits(settings)
    os.chdir(settings["workdir"])
    os.umask(0o077)
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    if settings["audit_hook"]:
        sys.addaudithook(_make_hook(settings["workdir"]))
    entry_point = settings.get("entry_point")
    del settings
    try:
        exec(code, module.__dict__)
    except BaseException as exc:  # SystemExit too: only a normal return counts
        _fail(fd, _safe_describe(exc))
    if not entry_point:
        _flush()
        _send(fd, {"done": True})
        exit(0)
    function = module.__dict__.get(entry_point)
    if not callable(function):
        _fail(fd, f"NameError: the program does not define {entry_point}()")
    _send(fd, {"ready": True})
    _serve(fd, function)
    _flush()
    exit(0)


if __name__ == "__main__":  # run as ``python -c``; importing it does nothing
    main()
