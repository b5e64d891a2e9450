"""eap-info: edge attribution statistics (SPEC §6)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    JsonOpt,
    PlotOpt,
    ProbeOpt,
    app,
    err_console,
    out_console,
    print_json,
    user_errors,
)
from cdscope.cli.options import with_settings
from cdscope.messages import wrote
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings import EapSettings, ModelSettings

BaselineOpt = Annotated[
    str | None,
    typer.Option(
        "--baseline",
        help="Base model to compare with: same architecture and layer count; only samples both "
        "answer correctly are used.",
    ),
]
EapOutOpt = Annotated[
    Path,
    typer.Option(
        "--out", "-o", help="Per-sample Parquet; the mean edge matrix goes to OUT.edges.parquet."
    ),
]


# A command's parameters are its options (Typer reads them from the signature); EapSettings'
# and ModelSettings' are generated (with_settings).
@app.command("eap-info")
@user_errors
@with_settings(ModelSettings, "model_settings")
@with_settings(EapSettings, "settings")
def eap_info(
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model (default: the embedded {EMBEDDED_NAME}).")
    ] = EMBEDDED_NAME,
    baseline: BaselineOpt = None,
    probe: ProbeOpt = None,
    out: EapOutOpt = Path("results/eap.parquet"),
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    settings: EapSettings = EapSettings(),
    model_settings: ModelSettings = ModelSettings(),
) -> None:
    """Edge attribution statistics of verified answers: intensity, information complexity, kurtosis (SPEC §6).

    Zero-ablation EAP on a layer-level graph (emb, attn/mlp per layer with q/k/v paths,
    logits; 4L^2 + 3L + 1 edges), one forward + one backward per batch; Loss = mean NLL
    of the answer tokens. Reports means with bootstrap 95% intervals (B = 2000) and, with
    --baseline, paired differences model - baseline.
    """
    from cdscope.commands.eap_info import eap_outputs, run_eap_info, write_eap_outputs
    from cdscope.core.models.opening import ModelOptions
    from cdscope.core.probes import load_pool
    from cdscope.io import check_parquet_output, check_plot_path
    from cdscope.output.render import eap_summary_table

    options = ModelOptions.from_settings(model_settings)
    target = check_parquet_output(out)
    if plot is not None:
        check_plot_path(plot)
    with eap_outputs(target, plot) as files:  # locked before the work, written as one set
        result = run_eap_info(model, baseline, load_pool(probe), settings, options, err_console)
        outputs = write_eap_outputs(result, target, plot, files)
    if as_json:
        tables = {"summary": result.summary, "paired": result.paired}
        print_json("eap-info", tables, counts=result.metadata["counts"], outputs=outputs)
    else:
        out_console.print(
            eap_summary_table(result.summary, result.paired, result.metadata["counts"])
        )
    for name, path in outputs.items():
        wrote(err_console, f"{name}: {path}")
