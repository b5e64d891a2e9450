"""probe (C, F, l_m; SPEC §2) and gradcheck (regulariser-gradient fidelity; SPEC §5)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    AttnOpt,
    BatchOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    NOpt,
    ProbeOpt,
    ResumeOpt,
    SeedsOpt,
    TemplateOpt,
    _models,
    app,
    err_console,
    out_console,
    user_errors,
)
from cdscope.errors import CdscopeError
from cdscope.messages import wrote


@app.command()
@user_errors
def probe(
    model: ModelOpt = None,
    seeds: SeedsOpt = 1,
    n: NOpt = 3,
    probe: ProbeOpt = None,
    template: TemplateOpt = "plain",
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")] = Path(
        "results/probe.parquet"
    ),
    estimator: Annotated[
        str,
        typer.Option(
            "--estimator", help="autograd (one backward) | fd (2K gated forwards, slow check)."
        ),
    ] = "autograd",
    fd_step: Annotated[
        float, typer.Option("--fd-step", help="Gate step h of the fd estimator.")
    ] = 1e-2,
    fd_order: Annotated[
        int,
        typer.Option(
            "--fd-order", help="fd stencil: 2 (2K passes, O(h^2)) or 4 (4K passes, O(h^4))."
        ),
    ] = 2,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    resume: ResumeOpt = False,
) -> None:
    """Measure the control matrix C, activation matrix F and l_m per family (SPEC §2).

    Writes one row per (model, seed, family, gate) with columns layer, sublayer, C, F,
    dl_dg, ell, dropped; run metadata is in the Parquet key-value metadata.
    """
    from cdscope.commands.probe import collect_control
    from cdscope.frames import ModelOptions, ProbeSettings
    from cdscope.io import check_writable
    from cdscope.probes import load_pool
    from cdscope.render import seed_summary_table

    settings = ProbeSettings(
        tuple(range(seeds)), n, template, estimator, batch_size, fd_step, fd_order
    )
    target = check_writable(out)
    pool = load_pool(probe)
    frame, _ = collect_control(
        _models(model),
        pool,
        settings,
        target,
        ModelOptions(device, dtype, attn),
        resume,
        err_console,
    )
    out_console.print(seed_summary_table(frame))
    wrote(err_console, f"{target} ({len(frame)} rows)")


def _eps_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CdscopeError(
            f"--eps takes comma-separated numbers like 0.05,0.01; got {text!r}"
        ) from None
    if not values or any(v <= 0 for v in values):
        raise CdscopeError(f"--eps values must be positive; got {text!r}")
    return values


@app.command()
@user_errors
def gradcheck(
    model: Annotated[
        str, typer.Option("--model", "-m", help="Model (default: the embedded smollm2-135m).")
    ] = "smollm2-135m",
    seeds: SeedsOpt = 3,
    n: NOpt = 3,
    probe: ProbeOpt = None,
    template: TemplateOpt = "plain",
    eps: Annotated[
        str, typer.Option("--eps", help="Comma-separated gate steps to sweep.")
    ] = "0.05,0.02,0.01,0.005,0.002,0.001",
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
    ] = False,
    batch_size: BatchOpt = None,
    first_seed: Annotated[
        int, typer.Option("--first-seed", min=0, help="Seeds run first-seed .. first-seed+seeds-1.")
    ] = 0,
) -> None:
    """Fidelity of the first-order CD-RFT gradients against the exact one (SPEC §5).

    Per seed: the exact d R(C(theta))/d theta by double backward, then the fixed-step
    proxy at each --eps (and the Richardson proxy too with --richardson-sweep), and the
    default estimator (Richardson, eps 0.01); cosine and
    relative L2 error against the exact gradient, with wall time of each.
    """
    from cdscope.commands.gradcheck import run_gradcheck
    from cdscope.io import check_writable
    from cdscope.probes import load_pool
    from cdscope.render import gradcheck_table

    eps_values = _eps_list(eps)
    target = check_writable(out)
    pool = load_pool(probe)
    frame = run_gradcheck(
        model,
        pool,
        tuple(range(first_seed, first_seed + seeds)),
        n,
        template,
        eps_values,
        target,
        device,
        dtype,
        attn,
        err_console,
        richardson_sweep,
        batch_size,
    )
    out_console.print(gradcheck_table(frame))
    wrote(err_console, str(target))
