"""random-ref: B_shared of random matrices, the reference a measured value is read against
(SPEC §4)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    JsonOpt,
    PlotOpt,
    app,
    err_console,
    out_console,
    print_json,
    user_errors,
)
from cdscope.cli.options import with_settings
from cdscope.messages import wrote
from cdscope.settings import RandomRefSettings

OutOpt = Annotated[
    Path, typer.Option("--out", "-o", help="Parquet of the T samples (stats in metadata).")
]


@app.command("random-ref")
@user_errors
@with_settings(RandomRefSettings, "reference")
def random_ref(
    out: OutOpt = Path("results/random_ref.parquet"),
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    reference: RandomRefSettings = RandomRefSettings(),
) -> None:
    """Distribution of B_shared for M x K matrices with i.i.d. Gaussian rows (SPEC §4).

    The 1/M lower bound is not what a random matrix gives: compare a measured value
    with this reference (mean, std, p95, p99, and the value's percentile).
    """
    from cdscope.commands.random_ref import run_random_reference
    from cdscope.output.render import random_ref_table

    result, target = run_random_reference(reference, out, plot)
    stats = result.stats
    if as_json:
        print_json("random-ref", {}, **stats, outputs={"samples": str(target)})
    else:
        out_console.print(random_ref_table(stats))
    wrote(err_console, f"{target}" + (f" and {plot}" if plot else ""))
