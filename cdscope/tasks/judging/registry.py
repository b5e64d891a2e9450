"""The verifier registry: verifier kind -> function, built-in and user-registered.

A verifier is ``function(task, completion, *, timeout) -> Verdict`` (a plain ``bool`` or
``(bool, message)`` is accepted too). Kinds come from three places: the built-in ones
(``verifiers.py``), ``register_verifier`` from Python, and entry points in the group
``cdscope.verifiers`` of installed packages (name: the kind; value: ``module:function``),
loaded once, on the first lookup, under a lock. A kind named ``code`` or ``code:<variant>``
needs the task's ``tests`` and ``entry_point``; every other kind needs ``answer``
(``record.required_fields``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points

from cdscope.errors import CdscopeError
from cdscope.tasks.record import Task

ENTRY_POINT_GROUP = "cdscope.verifiers"
VERIFIER_ERROR = "verifier error"  # the reason's prefix when judging raised


@dataclass(frozen=True)
class Verdict:
    """Whether the completion passed, and a short reason; ``seconds``: how long the
    verdict took, from the start of ``verify`` (not part of a verdict's identity)."""

    passed: bool
    message: str
    seconds: float = field(default=0.0, compare=False)

    @property
    def crashed(self) -> bool:
        """Whether judging raised (the completion scored 0 for it: ``verifiers.verify``)."""
        return not self.passed and self.message.startswith(VERIFIER_ERROR + ": ")


VERIFIERS: dict[str, Callable[..., object]] = {}
_lock = threading.Lock()
_plugins_loaded = False


def register_verifier(kind: str, function: Callable[..., object], *, replace: bool = False) -> None:
    """Make ``kind`` a verifier kind of task files, checked by ``function``.

    ``function(task, completion, *, timeout)`` returns a ``Verdict``, a ``bool`` or
    ``(bool, message)``. Re-registering a kind needs ``replace=True`` (a second plugin
    must not silently replace a scorer)."""
    if not isinstance(kind, str) or not kind.strip() or kind != kind.strip():
        raise CdscopeError(f"a verifier kind must be a non-empty name, got {kind!r}")
    if not callable(function):
        raise CdscopeError(f"verifier {kind!r}: {function!r} is not callable")
    with _lock:
        if kind in VERIFIERS and not replace and VERIFIERS[kind] is not function:
            raise CdscopeError(
                f"verifier kind {kind!r} is already registered; pass replace=True to replace it"
            )
        VERIFIERS[kind] = function


def _load_plugins() -> None:
    global _plugins_loaded
    with _lock:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        found = list(entry_points(group=ENTRY_POINT_GROUP))
    for point in found:
        if point.name in VERIFIERS:
            continue  # built-in and Python-registered kinds win
        try:
            function = point.load()
        except Exception as exc:
            raise CdscopeError(
                f"verifier plugin {point.name!r} ({point.value}) cannot be loaded: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        register_verifier(point.name, function)


def verifier_kinds() -> list[str]:
    """Every known kind, sorted (entry points loaded first)."""
    _load_plugins()
    return sorted(VERIFIERS)


def _as_verdict(kind: str, result: object) -> Verdict:
    if isinstance(result, Verdict):
        return result
    if type(result) is bool:
        return Verdict(result, "ok" if result else "wrong answer")
    if (
        isinstance(result, tuple)
        and len(result) == 2
        and type(result[0]) is bool
        and isinstance(result[1], str)
    ):
        return Verdict(result[0], result[1])
    raise CdscopeError(
        f"verifier {kind!r} returned {type(result).__name__}; return a Verdict, a bool or "
        "(bool, message)"
    )


def verifier_for(task: Task) -> Callable[..., Verdict]:
    """The verdict function of ``task.verifier`` (CdscopeError for an unknown kind)."""
    function = VERIFIERS.get(task.verifier)
    if function is None:
        kinds = verifier_kinds()
        function = VERIFIERS.get(task.verifier)
        if function is None:
            raise CdscopeError(
                f"task {task.id!r}: unknown verifier kind {task.verifier!r} "
                f"(known: {', '.join(kinds)})"
            )
    kind = task.verifier

    def run(task: Task, completion: str, *, timeout: float) -> Verdict:
        return _as_verdict(kind, function(task, completion, timeout=timeout))

    return run
