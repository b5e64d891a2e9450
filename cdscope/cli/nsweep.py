"""nsweep: plain and noise-corrected B_shared(C) against the probe size n (SPEC §4)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    FromOpt,
    JsonOpt,
    ModelOpt,
    PlotOpt,
    ProbeOpt,
    ResumeOpt,
    app,
    err_console,
    models_or_embedded,
    out_console,
    print_json,
    refuse_with_from,
    user_errors,
)
from cdscope.cli.options import annotated, with_settings
from cdscope.errors import CdscopeError
from cdscope.messages import wrote
from cdscope.settings import ModelSettings, NsweepSettings, ProbeSettings

OutOpt = Annotated[
    Path,
    typer.Option("--out", "-o", help="Per-seed Parquet; OUT.summary/.probe.parquet beside it."),
]


# A command's parameters are its options (Typer reads them from the signature).
@app.command()
@user_errors
@with_settings(ModelSettings, "model_settings")
def nsweep(  # size: 12 parameters, each one command-line option (Typer reads the signature)
    model: ModelOpt = None,
    seeds: annotated(NsweepSettings, "seeds") = NsweepSettings.seeds,
    ns: Annotated[
        str, typer.Option("--ns", help="Probe sizes n to sweep, comma-separated.")
    ] = ",".join(map(str, NsweepSettings.ns)),
    probe: ProbeOpt = None,
    template: annotated(ProbeSettings, "template") = ProbeSettings.template,
    out: OutOpt = Path("results/nsweep.parquet"),
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    from_path: FromOpt = None,
    resume: ResumeOpt = False,
    batch_size: annotated(ProbeSettings, "batch_size") = None,
    model_settings: ModelSettings = ModelSettings(),
) -> None:
    """B_shared(C) and its noise-corrected twin against the probe size n, over seeds.

    Measures one per-sample probe with max(--ns) samples per family per seed and reads
    every smaller n from nested subsets of it (docs/nsweep.md); plain B_shared falls
    towards 1/M at small n, the corrected one (unbiased Gram, n >= 2) much less.
    """
    from cdscope.commands.audit import sibling
    from cdscope.commands.nsweep import run_nsweep
    from cdscope.commands.requests import ProbeRequest
    from cdscope.core.models.opening import ModelOptions
    from cdscope.io import check_parquet_output, check_plot_path
    from cdscope.output.render import nsweep_table

    sweep = NsweepSettings.parse(seeds, ns)
    target = check_parquet_output(out)
    if plot is not None:
        check_plot_path(plot)
    if from_path is not None and resume:
        raise CdscopeError("--resume continues a measurement; it does not apply to --from")
    if from_path is not None:
        measuring = {"probe": bool(probe), "batch_size": batch_size is not None}
        refuse_with_from({k: True for k, v in measuring.items() if v} | model_settings.changed())
    settings = ProbeSettings(
        tuple(range(sweep.seeds)), max(sweep.ns), template, "autograd", batch_size
    )
    request = ProbeRequest(
        out=target, model_specs=models_or_embedded(model) if from_path is None else model,
        settings=settings, from_path=from_path, probe_paths=probe,
        options=ModelOptions.from_settings(model_settings), resume=resume,
    )  # fmt: skip
    result = run_nsweep(request, sweep.ns, err_console, plot)
    outputs = {"per_seed": target, "summary": sibling(target, "summary")}
    outputs |= {"probe": sibling(target, "probe")} if from_path is None else {}
    outputs |= {"plot": plot} if plot is not None else {}
    if as_json:
        tables = {"summary": result.summary, "per_seed": result.per_seed}
        print_json(
            "nsweep", tables, ns=list(sweep.ns), outputs={k: str(v) for k, v in outputs.items()}
        )
    else:
        out_console.print(nsweep_table(result.summary))
    for name, path in outputs.items():
        wrote(err_console, f"{name}: {path}")
