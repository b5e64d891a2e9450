"""probe (C, F, l_m; SPEC §2) and gradcheck (regulariser-gradient fidelity; SPEC §5)."""

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
    GranularityOpt,
    JsonOpt,
    MaxMemoryOpt,
    ModelOpt,
    NOpt,
    OffloadDirOpt,
    ProbeOpt,
    RecomputeOpt,
    ResumeOpt,
    RevisionOpt,
    SeedsOpt,
    TemplateOpt,
    TrustRemoteCodeOpt,
    app,
    err_console,
    model_options,
    models_or_embedded,
    out_console,
    print_json,
    resume_arg,
    user_errors,
)
from cdscope.cli.params import SEED_MAX, finite
from cdscope.errors import CdscopeError
from cdscope.messages import wrote
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings import GradcheckSettings, ProbeSettings


@app.command()
@user_errors
def probe(
    model: ModelOpt = None,
    seeds: SeedsOpt = 1,
    n: NOpt = ProbeSettings.n,
    probe: ProbeOpt = None,
    template: TemplateOpt = ProbeSettings.template,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")] = Path(
        "results/probe.parquet"
    ),
    estimator: Annotated[
        str,
        typer.Option(
            "--estimator", help="autograd (one backward) | fd (2K gated forwards, slow check)."
        ),
    ] = ProbeSettings.estimator,
    fd_step: Annotated[
        float,
        typer.Option(
            "--fd-step", parser=finite(0, 1, low_open=True), help="Gate step h of the fd estimator."
        ),
    ] = ProbeSettings.fd_step,
    fd_order: Annotated[
        int,
        typer.Option(
            "--fd-order", help="fd stencil: 2 (2K passes, O(h^2)) or 4 (4K passes, O(h^4))."
        ),
    ] = ProbeSettings.fd_order,
    batch_size: BatchOpt = None,
    granularity: GranularityOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_dir: OffloadDirOpt = None,
    resume: ResumeOpt = False,
    revision: RevisionOpt = None,
    trust_remote_code: TrustRemoteCodeOpt = False,
    as_json: JsonOpt = False,
    recompute: RecomputeOpt = False,
) -> None:
    """Measure the control matrix C, activation matrix F and l_m per family (SPEC §2).

    Writes one row per (model, seed, family, gate) with columns layer, sublayer, unit
    (head / expert / neuron index at a finer --granularity, else null), C, F, dl_dg, ell,
    dropped; run metadata is in the Parquet key-value metadata.
    """
    from cdscope.commands.probe import collect_control
    from cdscope.core.probes import load_pool
    from cdscope.io import check_writable
    from cdscope.output.render import seed_summary_table

    settings = ProbeSettings(
        tuple(range(seeds)), n, template, estimator, batch_size, fd_step, fd_order,
        granularity or ProbeSettings.granularity,
    )  # fmt: skip
    options = model_options(
        device, dtype, attn, device_map, max_memory, offload_dir, revision, trust_remote_code
    )
    target = check_writable(out)
    pool = load_pool(probe)
    frame, _ = collect_control(
        models_or_embedded(model),
        pool,
        settings,
        target,
        options,
        resume_arg(resume, recompute),
        err_console,
    )
    if as_json:
        print_json("probe", {"per_seed": _seed_records(frame)}, outputs={"probe": str(target)})
    else:
        out_console.print(seed_summary_table(frame))
    wrote(err_console, f"{target} ({len(frame)} rows)")


def _seed_records(frame) -> list[dict]:  # noqa: ANN001
    """``probe --json``: per (model, seed) the table's numbers (fractions), l_m per family."""
    from cdscope.analysis.spectral import b_shared
    from cdscope.output.frames import control_matrices

    C, F = control_matrices(frame, "C"), control_matrices(frame, "F")  # noqa: N806
    records = []
    for (model, seed), group in frame.groupby(["model", "seed"], sort=False):
        kept = C.get((model, int(seed)))
        enough = kept is not None and len(kept[0]) >= 2
        records.append(
            {
                "model": model,
                "seed": int(seed),
                "B_shared_C": float(b_shared(kept[1])) if enough else None,
                "B_shared_F": float(b_shared(F[(model, int(seed))][1])) if enough else None,
                "ell": group.groupby("family")["ell"].first().to_dict(),
                "dropped": sorted(group.loc[group["dropped"], "family"].unique()),
            }
        )
    return records


def _eps_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CdscopeError(
            f"--eps takes comma-separated numbers like 0.05,0.01; got {text!r}"
        ) from None
    if not values or not all(0 < v < 1 for v in values):  # NaN fails every comparison
        raise CdscopeError(f"--eps values must be finite numbers in (0, 1); got {text!r}")
    return values


@app.command()
@user_errors
def gradcheck(
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model (default: the embedded {EMBEDDED_NAME}).")
    ] = EMBEDDED_NAME,
    seeds: SeedsOpt = len(GradcheckSettings.seeds),
    n: NOpt = GradcheckSettings.n,
    probe: ProbeOpt = None,
    template: TemplateOpt = GradcheckSettings.template,
    eps: Annotated[
        str, typer.Option("--eps", help="Comma-separated gate steps to sweep.")
    ] = ",".join(f"{e:g}" for e in GradcheckSettings.eps),
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")] = Path(
        "results/gradcheck.parquet"
    ),
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: Annotated[
        str, typer.Option("--attn", help="Attention kernel; the exact gradient needs eager.")
    ] = "eager",
    richardson_sweep: Annotated[
        bool,
        typer.Option(
            "--richardson-sweep", help="Also sweep the Richardson proxy over every --eps."
        ),
    ] = GradcheckSettings.richardson_sweep,
    batch_size: BatchOpt = None,
    device_map: DeviceMapOpt = None,
    max_memory: MaxMemoryOpt = None,
    offload_dir: OffloadDirOpt = None,
    first_seed: Annotated[
        int,
        typer.Option(
            "--first-seed", min=0, max=SEED_MAX, help="Seeds run first-seed .. first-seed+seeds-1."
        ),
    ] = GradcheckSettings.seeds[0],
    granularity: GranularityOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Fidelity of the first-order CD-RFT gradients against the exact one (SPEC §5).

    Per seed: the exact d R(C(theta))/d theta by double backward, then the fixed-step
    proxy and the folded proxy at each --eps (and the Richardson proxy too with
    --richardson-sweep), and the default estimator; cosine and
    relative L2 error against the exact gradient, with wall time of each.
    """
    from cdscope.commands.gradcheck import run_gradcheck
    from cdscope.core.probes import load_pool
    from cdscope.io import check_writable
    from cdscope.output.render import gradcheck_table

    eps_values = _eps_list(eps)
    options = model_options(device, dtype, attn, device_map, max_memory, offload_dir)
    target = check_writable(out)
    pool = load_pool(probe)
    settings = GradcheckSettings(
        tuple(range(first_seed, first_seed + seeds)),
        n,
        template,
        tuple(eps_values),
        richardson_sweep,
        batch_size,
        granularity or GradcheckSettings.granularity,
    )
    frame = run_gradcheck(
        model_spec=model, pool=pool, settings=settings, out=target, options=options,
        console=err_console,
    )  # fmt: skip
    if as_json:
        print_json("gradcheck", {"rows": frame}, outputs={"gradcheck": str(target)})
    else:
        out_console.print(gradcheck_table(frame))
    wrote(err_console, str(target))
