"""probe (C, F, l_m; SPEC §2) and gradcheck (regulariser-gradient fidelity; SPEC §5)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    JsonOpt,
    ModelOpt,
    ProbeOpt,
    RecomputeOpt,
    ResumeOpt,
    SeedsOpt,
    app,
    err_console,
    models_or_embedded,
    out_console,
    print_json,
    resume_arg,
    user_errors,
)
from cdscope.cli.options import annotated, with_settings
from cdscope.cli.params import SEED_MAX, finite
from cdscope.errors import CdscopeError
from cdscope.messages import wrote
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings import GradcheckSettings, ModelSettings, ProbeSettings


@app.command()
@user_errors
@with_settings(ModelSettings, "model_settings")
def probe(  # size: 16 parameters, each one command-line option (Typer reads the signature)
    model: ModelOpt = None,
    seeds: SeedsOpt = 1,
    n: annotated(ProbeSettings, "n") = ProbeSettings.n,
    probe: ProbeOpt = None,
    template: annotated(ProbeSettings, "template") = ProbeSettings.template,
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")] = Path(
        "results/probe.parquet"
    ),
    estimator: annotated(ProbeSettings, "estimator") = ProbeSettings.estimator,
    fd_step: annotated(ProbeSettings, "fd_step") = ProbeSettings.fd_step,
    fd_order: annotated(ProbeSettings, "fd_order") = ProbeSettings.fd_order,
    batch_size: annotated(ProbeSettings, "batch_size") = None,
    granularity: annotated(ProbeSettings, "granularity") = ProbeSettings.granularity,
    probe_split: annotated(ProbeSettings, "probe_split") = ProbeSettings.probe_split,
    resume: ResumeOpt = False,
    as_json: JsonOpt = False,
    recompute: RecomputeOpt = False,
    model_settings: ModelSettings = ModelSettings(),
) -> None:
    """Measure the control matrix C, activation matrix F and l_m per family (SPEC §2).

    Writes one row per (model, seed, family, gate) with columns layer, sublayer, unit
    (head / expert / neuron index at a finer --granularity, else null), C, F, dl_dg, ell,
    dropped; run metadata is in the Parquet key-value metadata.
    """
    from cdscope.commands.probe import collect_control
    from cdscope.commands.requests import ProbeRun
    from cdscope.core.models.opening import ModelOptions
    from cdscope.core.probes import load_pool
    from cdscope.io import check_parquet_output
    from cdscope.output.render import seed_summary_table

    settings = ProbeSettings(
        tuple(range(seeds)), n, template, estimator, batch_size, fd_step, fd_order, granularity,
        probe_split,
    )  # fmt: skip
    options = ModelOptions.from_settings(model_settings)
    target = check_parquet_output(out)
    pool = load_pool(probe)
    run = ProbeRun(
        models_or_embedded(model), pool, settings, target, options, resume_arg(resume, recompute)
    )
    frame, _ = collect_control(run, err_console)
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


def _eps_list(text: str) -> tuple[float, ...]:
    """``--eps 0.05,0.01`` -> (0.05, 0.01): each a finite number in (0, 1), refused as
    typed (``params.finite``)."""
    parse = finite(0, 1, low_open=True)
    try:
        return tuple(parse(x) for x in text.split(",") if x.strip())
    except typer.BadParameter as exc:
        raise CdscopeError(
            f"--eps takes comma-separated numbers in (0, 1) like 0.05,0.01; {exc.message}"
        ) from None


@app.command()
@user_errors
@with_settings(ModelSettings, "model_settings", attn="eager")  # the exact gradient needs eager
@with_settings(GradcheckSettings, "swept")
def gradcheck(  # size: 9 parameters, each one command-line option (Typer reads the signature)
    model: Annotated[
        str, typer.Option("--model", "-m", help=f"Model (default: the embedded {EMBEDDED_NAME}).")
    ] = EMBEDDED_NAME,
    seeds: SeedsOpt = len(GradcheckSettings.seeds),
    probe: ProbeOpt = None,
    eps: Annotated[
        str, typer.Option("--eps", help="Comma-separated gate steps to sweep.")
    ] = ",".join(f"{e:g}" for e in GradcheckSettings.eps),
    out: Annotated[Path, typer.Option("--out", "-o", help="Output Parquet file.")] = Path(
        "results/gradcheck.parquet"
    ),
    first_seed: Annotated[
        int,
        typer.Option(
            "--first-seed", min=0, max=SEED_MAX, help="Seeds run first-seed .. first-seed+seeds-1."
        ),
    ] = GradcheckSettings.seeds[0],
    as_json: JsonOpt = False,
    swept: GradcheckSettings = GradcheckSettings(),
    model_settings: ModelSettings = ModelSettings(),
) -> None:
    """Fidelity of the first-order CD-RFT gradients against the exact one (SPEC §5).

    Per seed: the exact d R(C(theta))/d theta by double backward, then the fixed-step
    proxy and the folded proxy at each --eps (and the Richardson proxy too with
    --richardson-sweep), and the default estimator; cosine and
    relative L2 error against the exact gradient, with wall time of each.
    """
    from cdscope.commands.gradcheck import run_gradcheck
    from cdscope.core.models.opening import ModelOptions
    from cdscope.core.probes import load_pool
    from cdscope.io import check_parquet_output
    from cdscope.output.render import gradcheck_table

    settings = dataclasses.replace(
        swept, seeds=tuple(range(first_seed, first_seed + seeds)), eps=_eps_list(eps)
    )
    options = ModelOptions.from_settings(model_settings)
    target = check_parquet_output(out)
    pool = load_pool(probe)
    frame = run_gradcheck(
        model_spec=model, pool=pool, settings=settings, out=target, options=options,
        console=err_console,
    )  # fmt: skip
    if as_json:
        print_json("gradcheck", {"rows": frame}, outputs={"gradcheck": str(target)})
    else:
        out_console.print(gradcheck_table(frame))
    wrote(err_console, str(target))
