"""Symbolic equivalence of math answers through math-verify, bounded by a deadline.

Answers that are not plain numbers -- roots, pi, sets, intervals, tuples, expressions --
are compared by math-verify (Hugging Face's checker, used by TRL and open-r1 for GRPO
rewards), which parses LaTeX into sympy. sympy can take unbounded time and memory
(``2^{2^{40}}``), and math-verify's timeouts are ``signal.alarm``, which only works on
the main thread -- the trainer verifies from threads. So math-verify runs in worker
processes (``symbolic_child.py``): each comparison is one JSON line there and back under
the verdict's deadline; a worker that misses it is killed (the verdict is a timeout,
i.e. wrong) and a fresh one starts next time. Workers are started on demand, reused
(at most ``MAX_IDLE`` kept), capped at ``MEMORY_MB`` of address space, and end when
this process exits (their stdin closes). Starting one (importing sympy, about 1 s) has
its own bound, ``START_TIMEOUT``, and does not count against a verdict's deadline; so
that a killed worker's successor is not started in the next verdict's time, every
comparison in flight has a spare starting (or idle) behind it: ``verify_many``'s slow
comparisons then cost ceil(slow / workers) x timeout, not that plus a start each.

Beyond math-verify's value equality the worker keeps sets apart from intervals, pairs and
tuples, and judges the **form** of the answer to a transform task (``transform``: the
prompt asks to simplify, expand, factor, rationalize, compute, evaluate or calculate):
the answer may show no mark of an unfinished transformation that the reference does not
show (``symbolic_child.features``) -- restating the question's expression is not the
answer (math-verify evaluates it, so ``\\sqrt{245}`` passed for 7√5, ``(x+1)^2`` for the
expansion, ``x^2-1`` for the factorisation: 7 of 8 such items).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from cdscope.errors import CdscopeError

MAX_IDLE = 4
MEMORY_MB = 2048
START_TIMEOUT = 60.0
MAX_REPLY = 1 << 16
_SOURCE = Path(__file__).with_name("symbolic_child.py")
_TRANSFORM = re.compile(
    r"\b(?:simplif\w*|expand\w*|factor(?:s|ed|ing|i[sz]e\w*)?|rationali[sz]\w*|compute|"
    r"evaluate|calculate)\b",
    re.IGNORECASE,
)
_FACTOR = re.compile(r"\bfactor(?:s|ed|ing|i[sz]e\w*)?\b", re.IGNORECASE)


def transform(prompt: str) -> str | None:
    """``"factor"`` when the prompt asks to factor, ``"other"`` for another transform
    (simplify, expand, rationalize, compute, evaluate, calculate), None for none."""
    if _FACTOR.search(prompt):
        return "factor"
    return "other" if _TRANSFORM.search(prompt) else None


class _Missed(Exception):
    """The worker did not answer in time."""


class _Ended(Exception):
    """The worker ended (or wrote nonsense) before answering."""


class _Worker:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-P", "-c", _SOURCE.read_text("utf-8"), str(MEMORY_MB)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.buffer = b""
        self.owner = os.getpid()  # a forked copy of this process must not use or kill it
        try:
            ready = self._line(time.monotonic() + START_TIMEOUT)
        except (_Missed, _Ended):
            self.kill()
            raise CdscopeError(
                "math-verify could not start for symbolic answer comparison; install it "
                "with `pip install math-verify` (a dependency of cdscope)"
            ) from None
        if ready != {"ready": True}:
            self.kill()
            raise CdscopeError("math-verify's worker started with an unexpected reply")

    def _line(self, deadline: float) -> object:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if left <= 0 or not poller.poll(max(1, int(left * 1000))):
                raise _Missed
            chunk = os.read(fd, MAX_REPLY)
            if not chunk or len(self.buffer) > MAX_REPLY:
                raise _Ended
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            raise _Ended from None

    def ask(self, request: dict, deadline: float) -> object:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
        except OSError:
            raise _Ended from None
        return self._line(deadline)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, 9)
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait()
        with contextlib.suppress(OSError):
            self.proc.stdout.close()  # type: ignore[union-attr]


_lock = threading.Lock()
_changed = threading.Condition(_lock)  # a spare finished starting
_idle: list[_Worker] = []
_pool = {"busy": 0, "starting": 0}  # comparisons in flight; spares being started


def _take() -> _Worker:
    """An idle worker of this process, else a spare that is starting, else a new one;
    then spares are started until every busy worker has one behind it."""
    worker = None
    with _lock:
        while worker is None:
            while _idle and worker is None:
                candidate = _idle.pop()
                worker = candidate if candidate.owner == os.getpid() else None
            if worker is not None or not _pool["starting"]:
                break
            _changed.wait(START_TIMEOUT)
        _pool["busy"] += 1
        spares = max(0, _pool["busy"] - len(_idle) - _pool["starting"])
        _pool["starting"] += spares
    for _ in range(spares):
        threading.Thread(target=_start_spare, daemon=True).start()
    if worker is None:
        try:
            worker = _Worker()
        except BaseException:
            _done()
            raise
    return worker


def _start_spare() -> None:
    try:
        worker: _Worker | None = _Worker()
    except Exception:  # the next _take starts one itself and reports why it cannot
        worker = None
    with _lock:
        _pool["starting"] -= 1
        kept = worker is not None and len(_idle) < MAX_IDLE
        if kept:
            _idle.append(worker)  # type: ignore[arg-type]
        _changed.notify_all()
    if worker is not None and not kept:
        worker.kill()


def _done() -> None:
    with _lock:
        _pool["busy"] -= 1


def _give_back(worker: _Worker) -> None:
    _done()
    with _lock:
        if len(_idle) < MAX_IDLE:
            _idle.append(worker)
            return
    worker.kill()


@atexit.register
def close_workers() -> None:
    """End every idle worker (busy ones end when their comparison returns or times out)."""
    with _lock:
        workers, _idle[:] = list(_idle), []
    for worker in workers:
        if worker.owner == os.getpid():
            worker.kill()


def symbolic_equal(
    gold: str, pred: str, *, timeout: float, form: str | None = None
) -> tuple[bool | None, str]:
    """``(equal, message)`` by math-verify within ``timeout`` seconds: ``equal`` is None
    when one side does not parse; a timeout or a failed worker is ``(False, why)``.
    ``form`` (``transform``'s answer) asks for the form judgment too."""
    request: dict = {"gold": gold, "pred": pred}
    if form is not None:
        request["factor"] = form == "factor"
    worker = _take()
    try:
        reply = worker.ask(request, time.monotonic() + timeout)
    except BaseException as exc:
        _done()
        worker.kill()
        if isinstance(exc, _Missed):
            return False, f"timeout after {timeout:.1f}s (symbolic comparison)"
        if isinstance(exc, _Ended):
            return False, "the symbolic comparison failed (its worker ended)"
        raise
    _give_back(worker)
    why = reply.get("why", "not equivalent") if type(reply) is dict else None
    if (
        type(reply) is dict
        and type(reply.get("equal")) in (bool, type(None))
        and type(why) is str
        and set(reply) <= {"equal", "why"}
    ):
        equal = reply["equal"]
        return equal, "ok" if equal else why[:120]
    error = reply.get("error") if type(reply) is dict else None
    return False, f"the symbolic comparison failed ({str(error)[:40]})"
