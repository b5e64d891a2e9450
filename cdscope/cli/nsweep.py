"""nsweep: plain and noise-corrected B_shared(C) against the probe size n (SPEC §4)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    AttnOpt,
    BatchOpt,
    DeviceOpt,
    DtypeOpt,
    FromOpt,
    JsonOpt,
    ModelOpt,
    PlotOpt,
    ProbeOpt,
    ResumeOpt,
    SeedsOpt,
    TemplateOpt,
    app,
    err_console,
    models_or_embedded,
    out_console,
    print_json,
    refuse_with_from,
    user_errors,
)
from cdscope.errors import CdscopeError
from cdscope.messages import wrote


@app.command()
@user_errors
def nsweep(
    model: ModelOpt = None,
    seeds: SeedsOpt = 7,
    ns: Annotated[
        str, typer.Option("--ns", help="Probe sizes n to sweep, comma-separated.")
    ] = "1,2,3,6,12,24",
    probe: ProbeOpt = None,
    template: TemplateOpt = "plain",
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Per-seed Parquet; OUT.summary/.probe.parquet beside it."),
    ] = Path("results/nsweep.parquet"),
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    from_path: FromOpt = None,
    resume: ResumeOpt = False,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
) -> None:
    """B_shared(C) and its noise-corrected twin against the probe size n, over seeds.

    Measures one per-sample probe with max(--ns) samples per family per seed and reads
    every smaller n from nested subsets of it (docs/nsweep.md); plain B_shared falls
    towards 1/M at small n, the corrected one (unbiased Gram, n >= 2) much less.
    """

    from cdscope.commands.audit import sibling
    from cdscope.commands.nsweep import parse_ns, run_nsweep
    from cdscope.io import check_plot_path, check_writable
    from cdscope.output.frames import ModelOptions, ProbeSettings
    from cdscope.output.render import nsweep_table

    sizes = parse_ns(ns)
    target = check_writable(out)
    if plot is not None:
        check_plot_path(plot)
    if from_path is not None and resume:
        raise CdscopeError("--resume continues a measurement; it does not apply to --from")
    if from_path is not None:
        given = {"probe": probe, "batch_size": batch_size, "device": device, "dtype": dtype,
                 "attn": attn}  # fmt: skip
        refuse_with_from(given, {"device": "auto", "dtype": "auto", "attn": "auto"})
    settings = ProbeSettings(tuple(range(seeds)), max(sizes), template, "autograd", batch_size)
    result = run_nsweep(
        target, sizes, models_or_embedded(model) if from_path is None else model, from_path, settings,
        probe, ModelOptions(device, dtype, attn), resume, err_console, plot,
    )  # fmt: skip
    outputs = {"per_seed": str(target), "summary": str(sibling(target, "summary"))}
    if from_path is None:
        outputs["probe"] = str(sibling(target, "probe"))
    if plot is not None:
        outputs["plot"] = str(plot)
    if as_json:
        tables = {"summary": result.summary, "per_seed": result.per_seed}
        print_json("nsweep", tables, ns=list(sizes), outputs=outputs)
    else:
        out_console.print(nsweep_table(result.summary))
    for name, path in outputs.items():
        wrote(err_console, f"{name}: {path}")
