"""report: one self-contained HTML page of finished runs (audits, eval, train)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.audits import FailAboveOpt
from cdscope.cli.common import app, err_console, user_errors
from cdscope.messages import wrote


@app.command("report")
@user_errors
def report(
    runs: Annotated[
        list[Path],
        typer.Argument(
            metavar="RUN_OUTPUT",
            help="Run outputs: an audit's Parquet (bshared, acg, decompose), an eval or a "
            "train --out-dir.",
            show_default=False,
        ),
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="The HTML page to write (.html).")
    ] = Path("results/report.html"),
    fail_above: FailAboveOpt = None,
) -> None:
    """One self-contained HTML page of finished runs: figures, tables, metadata (docs/report.md).

    Figures are inline PNGs and no resource is loaded from elsewhere, so the file can be
    mailed or attached to a CI job. Nothing is measured again: every number comes from
    the run's Parquet files. With --fail-above (or an audit run with it), each audit shows
    its verdict and the command exits 1 when a model's mean B_shared(C) is above.
    """
    from cdscope.commands.report import build_report
    from cdscope.errors import AuditFailed

    built = build_report(runs, out, fail_above)
    wrote(err_console, f"report: {out} ({len(built)} run(s))")
    failed = [f for run in built if run.verdict for f in run.verdict.failed]
    if failed:
        raise AuditFailed(f"mean B_shared(C) above the threshold: {', '.join(failed)}")
