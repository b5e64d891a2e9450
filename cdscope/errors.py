"""User-facing errors.

``CdscopeError`` is raised for anything the *user* got wrong (a bad path, a malformed
probe line, an impossible option combination). The CLI turns it into one red line on
stderr and exit code 2 — never a traceback. Programming errors stay ordinary exceptions.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

#: True while a call of the Python API runs (``python_api``): messages then name inputs
#: as its arguments (``batch_size=0``), not as command-line flags (``--batch-size 0``)
_PYTHON_API = contextvars.ContextVar("cdscope_python_api", default=False)
_UNSET = object()


@contextlib.contextmanager
def python_api() -> Iterator[None]:
    """Inside this block, errors name inputs the way the Python API spells them."""
    token = _PYTHON_API.set(True)
    try:
        yield
    finally:
        _PYTHON_API.reset(token)


def in_python() -> bool:
    """Whether the running call came through the Python API (``python_api``)."""
    return _PYTHON_API.get()


def option(name: str, value: object = _UNSET, *, flag: str | None = None) -> str:
    """Input ``name`` (a settings field, which is also the API's argument name) as the
    user wrote it: ``--batch-size`` on the command line, ``batch_size`` in Python; with a
    ``value``: ``--batch-size 0`` / ``batch_size=0``. ``flag``: the command-line spelling
    where it is not ``--`` + the name with dashes (``lam`` is ``--lambda``)."""
    if in_python():
        return name if value is _UNSET else f"{name}={value!r}"
    spelled = flag or "--" + name.replace("_", "-")
    return spelled if value is _UNSET else f"{spelled} {value}"


class CdscopeError(Exception):
    """A bad input the user can fix; the message says what was wrong and how to fix it."""

    exit_code = 2


class AuditFailed(Exception):
    """A ``--fail-above`` style audit threshold was exceeded (exit code 1)."""

    exit_code = 1


def missing_extra(what: str, extra: str, reason: object) -> CdscopeError:
    """The one-line error for an optional dependency group (pyproject extra) not installed.

    ``what`` names the feature, ``reason`` why it is unavailable (an import error)."""
    return CdscopeError(
        f"{what} needs the {extra} extra ({reason}); install it with pip install 'cdscope[{extra}]'"
    )
