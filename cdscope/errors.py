"""User-facing errors.

``CdscopeError`` is raised for anything the *user* got wrong (a bad path, a malformed
probe line, an impossible option combination). The CLI turns it into one red line on
stderr and exit code 2 — never a traceback. Programming errors stay ordinary exceptions.
"""

from __future__ import annotations


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
