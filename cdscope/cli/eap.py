"""eap-info: edge attribution statistics (SPEC §6)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    AttnOpt,
    BatchOpt,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    MaxMemoryOpt,
    OffloadDirOpt,
    PlotOpt,
    ProbeOpt,
    RevisionOpt,
    TrustRemoteCodeOpt,
    app,
    err_console,
    model_options,
    out_console,
    print_json,
    user_errors,
)
from cdscope.cli.params import COUNT_MAX, SEED_MAX
from cdscope.messages import wrote
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings import EapSettings


@app.command("eap-info")
@user_errors
def eap_info(
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model (default: the embedded {EMBEDDED_NAME}).")
    ] = EMBEDDED_NAME,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            help="Base model to compare with: same architecture and layer count; only samples both answer correctly are used.",
        ),
    ] = None,
    family: Annotated[
        str,
        typer.Option("--family", "-f", help="Probe family whose prompts are answered and scored."),
    ] = EapSettings.family,
    n: Annotated[
        int,
        typer.Option(
            "--n", min=1, max=COUNT_MAX, help="Samples drawn from the family (seeded, SPEC §4)."
        ),
    ] = EapSettings.n,
    seed: Annotated[
        int,
        typer.Option(
            "--seed", min=0, max=SEED_MAX, help="Probe draw seed; also seeds the bootstrap."
        ),
    ] = EapSettings.seed,
    probe: ProbeOpt = None,
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="Per-sample Parquet; the mean edge matrix goes to OUT.edges.parquet.",
        ),
    ] = Path("results/eap.parquet"),
    plot: PlotOpt = None,
    use_targets: Annotated[
        bool,
        typer.Option(
            "--use-targets",
            help="Score the probe targets instead of the model's verified answers (answer_source = probe_target).",
        ),
    ] = EapSettings.use_targets,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens",
            min=1,
            max=COUNT_MAX,
            help="Skip (and count) samples whose prompt + answer is longer.",
        ),
    ] = EapSettings.max_tokens,
    max_new_tokens: Annotated[
        int,
        typer.Option(
            "--max-new-tokens", min=1, max=COUNT_MAX, help="Greedy generation bound per answer."
        ),
    ] = EapSettings.max_new_tokens,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_dir: OffloadDirOpt = None,
    revision: RevisionOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Edge attribution statistics of verified answers: intensity, information complexity, kurtosis (SPEC §6).

    Zero-ablation EAP on a layer-level graph (emb, attn/mlp per layer with q/k/v paths,
    logits; 4L^2 + 3L + 1 edges), one forward + one backward per batch; Loss = mean NLL
    of the answer tokens. Reports means with bootstrap 95% intervals (B = 2000) and, with
    --baseline, paired differences model - baseline.
    """
    from cdscope.commands.eap_info import eap_outputs, run_eap_info, write_eap_outputs
    from cdscope.core.probes import load_pool
    from cdscope.io import check_plot_path, check_writable
    from cdscope.output.render import eap_summary_table

    settings = EapSettings(family, n, seed, use_targets, max_tokens, max_new_tokens, batch_size)
    options = model_options(
        device, dtype, attn, device_map, max_memory, offload_dir, revision, trust_remote_code
    )
    target = check_writable(out)
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
