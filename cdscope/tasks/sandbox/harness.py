"""Code-task verdicts decided in this process: the tests run here, the candidate in the sandbox.

In RL post-training the verifier is the reward, so a completion must not be able to make
a wrong program score as passing. The principle: untrusted code runs only in the sandbox
child and sees only the inputs of each call; the verdict is decided here.

1. The child (``sandbox.start_candidate``, only where the mount layer hides the host's
   files) executes ``prompt + code`` and then serves calls of the entry point. It never
   receives the tests, cannot read the task files, holds no secret, and its exit code
   and output play no part in the verdict.
2. Here, in a fresh namespace, the task's prompt (trusted: it is the task file's, and
   holds helpers the tests use, e.g. HumanEval/32's ``poly``) and tests are executed;
   the entry point's name is bound to a ``RemoteCandidate`` and ``check(candidate)`` is
   called -- the HumanEval harness, so property-style tests (``abs(f(x)) < tol``) work.
3. Each call sends its arguments as plain data and gets plain data back (the tagged
   format of ``child``): decoded into exact built-in types, so no object of the
   program's reaches the tests (no always-equal ``__eq__``, no monkeypatched builtins --
   the program's builtins are its own process's). A value that is not plain data, a
   malformed frame, a dead child or the deadline fail the verdict through ``_Broken``,
   which the tests' ``except Exception`` cannot swallow (a flag backs it up). An
   exception the candidate raised reaches the tests as the same built-in type (else
   ``CandidateError``), so tests that expect one keep working.
4. Verdict: passed iff ``check`` returned, no call broke the protocol, and the tests
   called the candidate at least once.

Care taken in this process (the tests are trusted, the values are not): decoding is
bounded (``child`` limits); one wall-clock deadline covers the child's start-up
and every call; the child is killed afterwards. The tests' ``random`` is a private
instance seeded with 0, so the caller's global RNG state is untouched (training resumes
stay bit-exact) and verdicts of randomised tests are reproducible. Arguments are copies:
a test that expects the candidate to mutate its argument in place cannot pass.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib.util
import re
import threading
import time
from types import CodeType

from cdscope.errors import CdscopeError
from cdscope.tasks.record import PROGRAM_KIND, Task
from cdscope.tasks.sandbox import child as wire
from cdscope.tasks.sandbox.layers import (
    SandboxClosed,
    SandboxProcess,
    SandboxTimeout,
    start_candidate,
)
from cdscope.tasks.sandbox.process import how_it_ended

MAX_MESSAGE = 300  # of a candidate's exception message passed to the tests
_ENDED = "\0ended"  # placeholder: the child's own last words are known after close()


class _Broken(BaseException):
    """The candidate broke the protocol: ends the check whatever the tests catch."""


class CandidateError(Exception):
    """The candidate raised an exception that is not a built-in ``Exception`` type."""


# Exceptions that steer control flow rather than report an error: raised into the tests
# as themselves they would change what the tests do -- a StopIteration inside
# ``all(map(candidate, cases))`` ends the iteration early and ``all`` returns True.
CONTROL_FLOW = (StopIteration, StopAsyncIteration, GeneratorExit, KeyboardInterrupt, SystemExit)


def _exception(name: str, message: str) -> Exception:
    """The candidate's exception as the tests see it: its built-in type where that is an
    ordinary ``Exception``; ``CandidateError`` for control-flow exceptions and the rest."""
    text = message[len(name) :].lstrip(": ") if message.startswith(name) else message
    text = text[:MAX_MESSAGE]
    kind = getattr(builtins, name, None) if name.isidentifier() else None
    if (
        isinstance(kind, type)
        and issubclass(kind, Exception)
        and not issubclass(kind, CONTROL_FLOW)
    ):
        try:
            return kind(text)
        except Exception:  # e.g. UnicodeDecodeError wants five arguments
            pass
    return CandidateError(f"{name}: {text}")


class RemoteCandidate:
    """Stands in for the candidate function: forwards each call to the sandbox child."""

    def __init__(self, child: SandboxProcess, timeout: float):
        self.child, self.timeout = child, timeout
        self.calls = 0
        self.failure = ""

    def _broken(self, message: str) -> _Broken:
        self.failure = self.failure or message
        return _Broken(self.failure)

    def __call__(self, *args: object, **kwargs: object) -> object:
        if self.failure:
            raise _Broken(self.failure)
        self.calls += 1
        try:
            request = {"a": wire.encode(list(args)), "k": wire.encode(kwargs)}
        except wire.WireError as exc:
            raise self._broken(f"the tests passed {exc} to the candidate") from None
        try:
            self.child.send(request)
            reply = self.child.receive()
        except (SandboxTimeout, wire.WireTimeout):
            raise self._broken(self.timed_out) from None
        except SandboxClosed:
            raise self._broken(_ENDED) from None
        except wire.WireError as exc:
            raise self._broken(f"the candidate answered with {exc}") from None
        return self._value(reply)

    @property
    def timed_out(self) -> str:
        return f"timeout after {self.timeout:.1f}s"

    def _value(self, reply: object) -> object:
        if type(reply) is dict and len(reply) == 1:
            ((key, data),) = reply.items()
            if key == "r":
                try:  # the deadline covers decoding: its cost is bounded, and checked
                    return wire.decode(data, deadline=self.child.deadline)
                except wire.WireTimeout:
                    raise self._broken(self.timed_out) from None
                except wire.WireError as exc:
                    raise self._broken(f"the candidate returned {exc}") from None
            if key == "x" and type(data) is list and [type(p) for p in data] == [str, str]:
                raise _exception(data[0], data[1])
            if key == "bad" and type(data) is str:
                raise self._broken(
                    f"the candidate returned {data[:MAX_MESSAGE]}; only plain data counts"
                )
        raise self._broken("the candidate answered with a malformed frame")


_PARSE_LOCK = threading.Lock()


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)``, one parse at a time in this process. CPython 3.11 keeps the
    AST constructor's recursion depth in interpreter-wide state, so two threads parsing at
    once (``verify_many``'s code verdicts) could fail an honest program with ``SystemError:
    AST constructor recursion depth mismatch`` (python/cpython#106905). A parse that meets
    it anyway -- another library's thread parsing beside it -- is tried once more."""
    with _PARSE_LOCK:
        try:
            return ast.parse(source)
        except SystemError:
            return ast.parse(source)


def with_stub_body(prompt: str) -> str:
    """``prompt``, or with ``pass`` as the body of its trailing bare ``def`` line when it
    does not parse alone (a prompt that is only a signature); unchanged when neither
    parses."""
    for source in (prompt, prompt.rstrip("\n") + "\n    pass\n"):
        try:
            parse_python(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        return source
    return prompt


@functools.lru_cache(maxsize=512)
def _compile(source: str, filename: str) -> CodeType:
    return compile(source, filename, "exec")


def _prompt_code(prompt: str) -> CodeType | None:
    """The prompt as a program: as it is (HumanEval prompts end with a docstring), else
    with a ``pass`` body for a trailing bare ``def`` line; None when neither compiles."""
    try:
        return _compile(with_stub_body(prompt), "<prompt>")
    except (SyntaxError, ValueError):
        return None


_RANDOM = importlib.util.find_spec("random")


def _test_builtins() -> dict:
    """Builtins whose ``import random`` gives a private ``random`` seeded with 0."""
    private: dict[str, object] = {}
    real_import = builtins.__import__

    def importer(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if name == "random" and level == 0 and _RANDOM is not None and _RANDOM.loader:
            if "random" not in private:
                module = importlib.util.module_from_spec(_RANDOM)
                _RANDOM.loader.exec_module(module)
                module.seed(0)
                private["random"] = module
            return private["random"]
        return real_import(name, globals, locals, fromlist, level)

    return {**vars(builtins), "__import__": importer}


def _task_error(task: Task, what: str, exc: BaseException) -> CdscopeError:
    return CdscopeError(
        f"task {task.id!r}: its {what} cannot run here ({wire.describe(exc, f'<{what}>')}); "
        "fix the task file"
    )


def _judge(task: Task, child: SandboxProcess, candidate: RemoteCandidate) -> tuple[bool, str]:
    namespace: dict = {"__name__": "__cdscope_tests__", "__builtins__": _test_builtins()}
    try:
        tests = _compile(task.tests or "", "<tests>")
    except (SyntaxError, ValueError) as exc:
        raise _task_error(task, "tests", exc) from None
    prompt = None if task.verifier == PROGRAM_KIND else _prompt_code(task.prompt)
    try:
        if prompt is not None:
            exec(prompt, namespace)  # trusted: the task file's own helpers
    except Exception as exc:
        raise _task_error(task, "prompt", exc) from None
    try:
        first = child.receive()
    except SandboxTimeout:
        return False, candidate.timed_out
    except SandboxClosed:
        return False, _ENDED
    except wire.WireError as exc:
        return False, f"the candidate answered with {exc}"
    if type(first) is dict and set(first) == {"error"} and type(first["error"]) is str:
        return False, program_failure(first["error"])
    if first != {"ready": True}:
        return False, "the candidate answered with a malformed frame"
    namespace[task.entry_point] = candidate
    try:
        exec(tests, namespace)
    except _Broken:  # tests that call the candidate at import: its failure, not theirs
        return False, candidate.failure
    except Exception as exc:
        if candidate.failure:
            return False, candidate.failure
        raise _task_error(task, "tests", exc) from None
    check = namespace.get("check")
    if not callable(check):
        raise CdscopeError(f"task {task.id!r}: its tests do not define check(candidate)")
    try:
        check(candidate)
    except _Broken:
        pass
    except Exception as exc:
        if not candidate.failure:
            return False, wire.describe(exc, "<tests>", "tests line")
    if candidate.failure:
        return False, candidate.failure
    if candidate.calls == 0:
        return False, "the tests never called the candidate"
    return True, "ok"


def run_check(
    task: Task, program: str, *, timeout: float, deadline: float | None = None
) -> tuple[bool, str]:
    """``(passed, message)``: ``task``'s ``check`` run here against ``program``'s entry
    point running in the sandbox (see the module docstring). ``deadline`` (``time.monotonic``
    seconds; default ``timeout`` from now) is the verdict's: what the caller spent before
    (reading the program) is not given to the child again."""
    if not task.entry_point:
        raise CdscopeError(f"task {task.id!r}: a code task needs 'tests' and 'entry_point'")
    left = (time.monotonic() + timeout if deadline is None else deadline) - time.monotonic()
    if left <= 0:
        return False, f"timeout after {timeout:.1f}s (before the program started)"
    try:
        child = start_candidate(program, task.entry_point, timeout=left)
    except (SandboxClosed, SandboxTimeout):  # it ended before reading its settings
        return False, "the sandbox child could not start (it ended before reading its settings)"
    except wire.WireError as exc:  # the program's settings frame is over MAX_FRAME
        return False, f"the program cannot be sent to the sandbox ({exc})"
    try:
        passed, message = _judge(task, child, RemoteCandidate(child, timeout))
    finally:
        child.close()
    if message == _ENDED:
        message = ended_early(child.returncode)
    return passed, message


_REPORTED = re.compile(
    r"([A-Za-z_][A-Za-z0-9_.]{0,60})(?::| \(|$).*?(?: \((?:program )?line (\d{1,7})\))?$"
)


def program_failure(report: str) -> str:
    """The verdict message for a program that failed before serving calls. The child's
    report is the program's to forge, so only its shape is used -- an exception type name
    and a line number -- in a sentence written here (``program failed: SyntaxError (line
    3)``); a verdict message never comes from the child."""
    match = _REPORTED.match(report.strip().splitlines()[-1][:300] if report.strip() else "")
    if match is None:
        return "program failed before serving calls"
    line = f" (program line {match.group(2)})" if match.group(2) else ""
    return f"program failed: {match.group(1)}{line}"


def ended_early(returncode: int | None) -> str:
    """The verdict message for a child that ended before answering: how it ended, as the
    operating system reports it (never the child's own output)."""
    return f"the program ended early ({how_it_ended(returncode)})"
