"""bshared, acg, decompose (one audit engine) and random-ref (SPEC §3-4)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    AttnOpt,
    AuditNOpt,
    AuditSeedsOpt,
    AuditTemplateOpt,
    BatchOpt,
    DeviceOpt,
    DtypeOpt,
    FromOpt,
    JsonOpt,
    ModelOpt,
    PlotOpt,
    ProbeOpt,
    ResumeOpt,
    _models,
    app,
    err_console,
    out_console,
    user_errors,
)
from cdscope.errors import CdscopeError
from cdscope.messages import wrote

BootstrapOpt = Annotated[
    int,
    typer.Option(
        "--bootstrap",
        help="Resamples of each family's probe samples for the per-seed intervals (0: none).",
    ),
]
DetectOpt = Annotated[
    float,
    typer.Option(
        "--detect",
        help="Paired Δ (percentage points) for the seeds-needed column (80% power, t-test).",
    ),
]


def _run_audit_command(
    command: str,
    model: list[str] | None,
    seeds: int | None,
    n: int | None,
    probe: list[Path] | None,
    template: str | None,
    out: Path,
    plot: Path | None,
    as_json: bool,
    from_path: Path | None,
    resume: bool,
    batch_size: int | None,
    device: str,
    dtype: str,
    attn: str,
    bootstrap: int = 1000,
    detect: float = 5.0,
):
    """Shared body of bshared / acg / decompose: measure or read, summarise, write, render."""
    from cdscope.commands.audit import AUDITS, run_audit, sibling
    from cdscope.frames import ModelOptions, ProbeSettings
    from cdscope.io import check_plot_path, check_writable

    spec = AUDITS[command]
    target = check_writable(out)
    if plot is not None:
        check_plot_path(plot)
    if from_path is not None and resume:
        raise CdscopeError("--resume continues a measurement; it does not apply to --from")
    if bootstrap < 0:
        raise CdscopeError(f"--bootstrap must be 0 (off) or a number of resamples; got {bootstrap}")
    if not detect > 0:
        raise CdscopeError(f"--detect is a positive difference in percentage points; got {detect}")
    settings = ProbeSettings(
        tuple(range(seeds or 3)), n or 3, template or "plain", "autograd", batch_size
    )
    explicit = {"n": n, "template": template}
    result = run_audit(
        spec,
        target,
        _models(model) if from_path is None else model,
        from_path,
        settings,
        probe,
        ModelOptions(device, dtype, attn),
        resume,
        err_console,
        explicit,
        bootstrap,
        detect / 100,
    )
    if result.per_seed.empty:
        raise CdscopeError(
            "no (model, seed) had at least 2 families with |l_m| >= 1e-4; nothing to report"
        )
    outputs = {
        "per_seed": str(target),
        "summary": str(sibling(target, "summary")),
        "convergence": str(sibling(target, "convergence")),
    }
    if from_path is None:
        outputs["probe"] = str(sibling(target, "probe"))
    if plot is not None:
        outputs["plot"] = str(plot)
    return spec, result, outputs


def _report(
    command: str, spec, result, outputs: dict, as_json: bool, extra: dict | None = None
) -> None:  # noqa: ANN001
    import json

    from cdscope.render import audit_table, convergence_table, per_seed_table

    if as_json:
        payload = {
            "command": command,
            "models": list(dict.fromkeys(result.per_seed["model"])),
            "summary": result.summary.to_dict(orient="records"),
            "paired": result.paired.to_dict(orient="records"),
            "per_seed": result.per_seed.to_dict(orient="records"),
            "refused_pairs": result.skipped_pairs,
            "convergence": result.convergence.to_dict(orient="records"),
            "bootstrap": result.metadata.get("bootstrap"),
            "detect": result.metadata.get("detect"),
            "notes": result.notes,
            "outputs": outputs,
            **(extra or {}),
        }
        typer.echo(json.dumps(payload, default=float, allow_nan=True))
    else:
        out_console.print(
            per_seed_table(result.per_seed, spec.headline, f"{spec.headline} per seed (%)")
        )
        out_console.print(
            audit_table(result.summary, result.paired, f"cdscope {command}: mean ± SE over seeds")
        )
        if not result.convergence.empty:
            out_console.print(convergence_table(result.convergence))
    for name, path in outputs.items():
        wrote(err_console, f"{name}: {path}")


@app.command()
@user_errors
def bshared(
    model: ModelOpt = None,
    seeds: AuditSeedsOpt = None,
    n: AuditNOpt = None,
    probe: ProbeOpt = None,
    template: AuditTemplateOpt = None,
    out: Annotated[
        Path,
        typer.Option("--out", "-o", help="Per-seed Parquet; OUT.summary/.probe.parquet beside it."),
    ] = Path("results/bshared.parquet"),
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
    fail_above: Annotated[
        float | None,
        typer.Option(
            "--fail-above",
            help="CI gate: exit 1 if a model's mean B_shared(C) exceeds PCT percent.",
        ),
    ] = None,
    from_path: FromOpt = None,
    resume: ResumeOpt = False,
    batch_size: BatchOpt = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    attn: AttnOpt = "auto",
    bootstrap: BootstrapOpt = 1000,
    detect: DetectOpt = 5.0,
) -> None:
    """Shared control bottleneck B_shared(C) = lambda_1 / tr(C C^T) per model and seed (SPEC §3).

    Reports mean ± SE over seeds (in %), R(C), and with several models the same-seed
    paired differences against the first model (mean ± SE, negatives, 95% t-interval,
    SD of Δ and the seeds needed to detect --detect at 80% power). Beside the plain
    numbers: B_shared and R of the noise-corrected Gram (*_unbiased, docs/bshared.md) and
    a bootstrap interval over probe samples for every per-seed value.
    """
    from cdscope.errors import AuditFailed

    spec, result, outputs = _run_audit_command(
        "bshared",
        model,
        seeds,
        n,
        probe,
        template,
        out,
        plot,
        as_json,
        from_path,
        resume,
        batch_size,
        device,
        dtype,
        attn,
        bootstrap,
        detect,
    )
    if plot is not None:
        _draw_audit("bshared", plot, result)
    failed = []
    if fail_above is not None:
        means = result.summary[result.summary["measure"] == "B_shared_C"]
        failed = [
            f"{r.model} {100 * r.mean:.1f}%"
            for r in means.itertuples()
            if 100 * r.mean > fail_above
        ]
    _report("bshared", spec, result, outputs, as_json, {"fail_above": fail_above, "failed": failed})
    if failed:
        raise AuditFailed(f"mean B_shared(C) above {fail_above}%: {', '.join(failed)}")


def _draw_audit(command: str, plot: Path, result) -> None:  # noqa: ANN001
    """The figure of each audit command."""
    from cdscope.plots import plot_audit, plot_decompose

    if command == "decompose":
        plot_decompose(plot, result.per_seed, result.summary)
        return
    measures, title = {
        "bshared": (["B_shared_C"], "B_shared(C)"),
        "acg": (["B_shared_F", "B_shared_C", "ACG"], "Activation vs control"),
    }[command]
    plot_audit(plot, title, result.per_seed, result.summary, result.paired, measures)


def _register_audit_command(command: str, doc: str) -> None:
    """acg and decompose share bshared's options (without the CI gate): one definition."""

    def audit_command(
        model: ModelOpt = None,
        seeds: AuditSeedsOpt = None,
        n: AuditNOpt = None,
        probe: ProbeOpt = None,
        template: AuditTemplateOpt = None,
        out: Annotated[
            Path,
            typer.Option(
                "--out", "-o", help="Per-seed Parquet; OUT.summary/.probe.parquet beside it."
            ),
        ] = Path(f"results/{command}.parquet"),
        plot: PlotOpt = None,
        as_json: JsonOpt = False,
        from_path: FromOpt = None,
        resume: ResumeOpt = False,
        batch_size: BatchOpt = None,
        device: DeviceOpt = "auto",
        dtype: DtypeOpt = "auto",
        attn: AttnOpt = "auto",
        bootstrap: BootstrapOpt = 1000,
        detect: DetectOpt = 5.0,
    ) -> None:
        spec, result, outputs = _run_audit_command(
            command, model, seeds, n, probe, template, out, plot, as_json, from_path, resume,
            batch_size, device, dtype, attn, bootstrap, detect,
        )  # fmt: skip
        if plot is not None:
            _draw_audit(command, plot, result)
        _report(command, spec, result, outputs, as_json)

    audit_command.__doc__ = doc
    audit_command.__name__ = command
    app.command(command)(user_errors(audit_command))


_register_audit_command(
    "acg",
    """Activation-control gap ACG = B_shared(F) - B_shared(C) per model and seed (SPEC §3).

    F measures how strongly each sublayer is used, C how strongly it controls the
    likelihood of verified answers; ACG > 0 means usage is more shared than control.
    """,
)
_register_audit_command(
    "decompose",
    """Decompose B_shared: direction sharing B_dir, row-norm share B_norm, |cos|, PR (SPEC §3).

    Per model and seed: B_dir (B_shared of the row-normalised C), B_norm (largest share of
    squared row norms), |cos| of every family pair and each family's participation ratio.
    Paired deltas of PR (a K-dependent count) are refused between models with different K.
    """,
)


@app.command("random-ref")
@user_errors
def random_ref(
    families: Annotated[
        int, typer.Option("--families", "-M", help="Number of families M (rows).")
    ] = 3,
    gates: Annotated[
        int | None,
        typer.Option("--gates", "-K", help="Number of gates K (columns); default: K of --model."),
    ] = None,
    trials: Annotated[
        int, typer.Option("--trials", "-T", help="Number of random matrices T.")
    ] = 50_000,
    seed: Annotated[int, typer.Option("--seed", help="RNG seed.")] = 0,
    value: Annotated[
        float | None,
        typer.Option("--value", help="A measured B_shared in percent: report its percentile."),
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Take K from this model (2 x layers).")
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Parquet of the T samples (stats in metadata).")
    ] = Path("results/random_ref.parquet"),
    plot: PlotOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Distribution of B_shared for M x K matrices with i.i.d. Gaussian rows (SPEC §4).

    The 1/M lower bound is not what a random matrix gives: compare a measured value
    with this reference (mean, std, p95, p99, and the value's percentile).
    """
    import json

    import pandas as pd

    from cdscope.io import check_plot_path, check_writable, run_metadata, write_parquet
    from cdscope.render import random_ref_table
    from cdscope.spectral import random_reference

    if families < 2:
        raise CdscopeError(
            f"--families must be at least 2 (B_shared of one row is always 1); got {families}"
        )
    if trials < 1:
        raise CdscopeError(f"--trials must be at least 1; got {trials}")
    if value is not None and not 0 < value <= 100:
        raise CdscopeError(f"--value is a percentage in (0, 100]; got {value}")
    if gates is None:
        if model is None:
            raise CdscopeError("give --gates K, or --model to take K from a model")
        from cdscope.models.loading import model_gate_count

        gates = model_gate_count(model)
    if gates < 1:
        raise CdscopeError(f"--gates must be at least 1; got {gates}")
    target = check_writable(out)
    if plot is not None:
        check_plot_path(plot)
    ref = random_reference(families, gates, trials, seed)
    fraction = None if value is None else value / 100
    percentile = None if fraction is None else ref.percentile_of(fraction)
    stats = {
        "M": families,
        "K": gates,
        "trials": trials,
        "seed": seed,
        "mean": ref.mean,
        "std": ref.std,
        "p95": ref.p95,
        "p99": ref.p99,
        "value": fraction,
        "percentile": percentile,
        "model": model,
    }
    write_parquet(
        pd.DataFrame({"trial": range(trials), "B_shared": ref.samples}),
        target,
        run_metadata("random-ref", **stats),
    )
    if plot is not None:
        from cdscope.plots import plot_random_reference

        plot_random_reference(
            plot, ref.samples, families, gates, ref.p95, ref.p99, fraction, percentile
        )
    if as_json:
        typer.echo(json.dumps(stats))
    else:
        out_console.print(random_ref_table(stats))
    wrote(err_console, f"{target}" + (f" and {plot}" if plot else ""))
