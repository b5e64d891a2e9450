"""The ``cdscope`` command line (Typer). Thin: parse, call one workflow, render.

One module per group of commands; importing them registers the commands on ``app``
(help lists them in this order). Exit codes: 0 success, 1 a failed audit threshold,
2 bad input (one line on stderr).
"""

from __future__ import annotations

from cdscope.cli import (  # noqa: F401 - registers the commands
    audits,
    eap,
    evaluate,
    inspect,
    measure,
    models,
    nsweep,
    report,
    train,
)
from cdscope.cli.common import app

__all__ = ["app", "main"]


def main() -> None:  # pragma: no cover - console entry point
    app()
