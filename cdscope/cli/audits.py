"""bshared, acg, decompose (one audit engine) and random-ref (SPEC §3-4)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    AttnOpt,
    AuditNOpt,
    AuditSeedsOpt,
    AuditTemplateOpt,
    BatchOpt,
    DeviceMapOpt,
    DeviceOpt,
    DtypeOpt,
    FromOpt,
    GranularityOpt,
    JsonOpt,
    MaxMemoryOpt,
    ModelOpt,
    OffloadDirOpt,
    PlotOpt,
    ProbeOpt,
    RecomputeOpt,
    ResumeOpt,
    RevisionOpt,
    TrustRemoteCodeOpt,
    app,
    err_console,
    model_options,
    models_or_embedded,
    out_console,
    print_json,
    refuse_with_from,
    resume_arg,
    user_errors,
)
from cdscope.cli.params import SEED_MAX, finite
from cdscope.errors import CdscopeError
from cdscope.messages import wrote

MAX_FAMILIES, MAX_GATES, MAX_TRIALS = 1_000, 100_000, 10_000_000  # random-ref bounds
BootstrapOpt = Annotated[
    int,
    typer.Option(
        "--bootstrap",
        min=0,
        max=100_000,
        help="Resamples of each family's probe samples for the per-seed intervals (0: none).",
    ),
]
DetectOpt = Annotated[
    float,
    typer.Option(
        "--detect",
        parser=finite(0, 100, low_open=True),
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
    resume: bool | str,
    batch_size: int | None,
    options,  # noqa: ANN001 - cdscope.output.frames.ModelOptions
    bootstrap: int = 1000,
    detect: float = 5.0,
    granularity: str | None = None,
    fail_above: float | None = None,
):
    """Shared body of bshared / acg / decompose: measure or read, summarise, write, render."""
    from cdscope.commands.audit import AUDITS, sibling
    from cdscope.commands.audit_run import run_audit
    from cdscope.io import check_plot_path, check_writable
    from cdscope.output.frames import ProbeSettings

    spec = AUDITS[command]
    target = check_writable(out)
    if plot is not None:
        check_plot_path(plot)
    if from_path is not None:
        given = {"--resume": resume, "--seeds": seeds, "--probe": probe, "--batch-size": batch_size}
        ignored = [flag for flag, value in given.items() if value]
        if ignored:
            raise CdscopeError(
                f"{', '.join(ignored)} does not apply to --from, which reads the seeds and "
                "probe of an existing file: drop it (or measure again without --from)"
            )
    if bootstrap < 0:
        raise CdscopeError(f"--bootstrap must be 0 (off) or a number of resamples; got {bootstrap}")
    if not detect > 0:
        raise CdscopeError(f"--detect is a positive difference in percentage points; got {detect}")
    settings = ProbeSettings(  # unset options: ProbeSettings' defaults (3 seeds for audits)
        tuple(range(seeds or 3)),
        n or ProbeSettings.n,
        template or ProbeSettings.template,
        batch_size=batch_size,
        granularity=granularity or ProbeSettings.granularity,
    )
    explicit = {"n": n, "template": template, "granularity": granularity}
    result = run_audit(
        spec,
        target,
        models_or_embedded(model) if from_path is None else model,
        from_path,
        settings,
        probe,
        options,
        resume,
        err_console,
        explicit,
        bootstrap,
        detect / 100,
        plot,
        fail_above,
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
        frame = result.probe_frame
        if "unit" in frame.columns and frame["unit"].notna().any():
            from cdscope.commands.audit_plot import units_plot_path

            outputs["units_plot"] = str(units_plot_path(plot))
    return spec, result, outputs


def _report(
    command: str, spec, result, outputs: dict, as_json: bool, extra: dict | None = None
) -> None:  # noqa: ANN001
    from cdscope.output.render import audit_table, convergence_table, per_seed_table

    if as_json:
        tables = {
            "summary": result.summary,
            "paired": result.paired,
            "per_seed": result.per_seed,
            "convergence": result.convergence,
        }
        print_json(
            command,
            tables,
            models=list(dict.fromkeys(result.per_seed["model"])),
            refused_pairs=result.skipped_pairs,
            bootstrap=result.metadata.get("bootstrap"),
            detect=result.metadata.get("detect"),
            notes=result.notes,
            outputs=outputs,
            **(extra or {}),
        )
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


FailAboveOpt = Annotated[
    float | None,
    typer.Option(
        "--fail-above",
        parser=finite(0, 100),
        help="CI gate: exit 1 if a model's mean B_shared(C) exceeds PCT percent.",
    ),
]
#: the placement options, in model_options' order, with their defaults
MODEL_DEFAULTS = {
    "device": "auto", "dtype": "auto", "attn": "auto", "device_map": None, "max_memory": None,
    "offload_dir": None, "revision": None, "trust_remote_code": False,
}  # fmt: skip
MODEL_KEYS = tuple(MODEL_DEFAULTS)


def _audit_parameters(command: str, gate: bool) -> list[inspect.Parameter]:
    """The options of bshared, acg and decompose, declared once in help order; ``gate``
    adds bshared's CI gate (--fail-above) after --json."""
    out_opt = Annotated[
        Path,
        typer.Option("--out", "-o", help="Per-seed Parquet; OUT.summary/.probe.parquet beside it."),
    ]
    declared = [
        ("model", ModelOpt, None), ("seeds", AuditSeedsOpt, None), ("n", AuditNOpt, None),
        ("probe", ProbeOpt, None), ("template", AuditTemplateOpt, None),
        ("out", out_opt, Path(f"results/{command}.parquet")), ("plot", PlotOpt, None),
        ("as_json", JsonOpt, False), *([("fail_above", FailAboveOpt, None)] if gate else []),
        ("from_path", FromOpt, None), ("resume", ResumeOpt, False),
        ("recompute", RecomputeOpt, False), ("batch_size", BatchOpt, None),
        ("granularity", GranularityOpt, None), ("device", DeviceOpt, MODEL_DEFAULTS["device"]),
        ("dtype", DtypeOpt, MODEL_DEFAULTS["dtype"]), ("attn", AttnOpt, MODEL_DEFAULTS["attn"]),
        ("device_map", DeviceMapOpt, None), ("max_memory", MaxMemoryOpt, None),
        ("offload_dir", OffloadDirOpt, None), ("revision", RevisionOpt, None),
        ("trust_remote_code", TrustRemoteCodeOpt, False),
        ("bootstrap", BootstrapOpt, 1000), ("detect", DetectOpt, 5.0),
    ]  # fmt: skip
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return [inspect.Parameter(name, kind, default=d, annotation=a) for name, a, d in declared]


def _register_audit_command(command: str, doc: str, gate: bool = False) -> None:
    """One factory for bshared, acg and decompose: the same options and body; bshared
    (``gate``) also takes --fail-above and exits 1 when a model's mean B_shared(C) is above."""

    def audit_command(**values: object) -> None:
        from cdscope.commands.audit import exceeding
        from cdscope.errors import AuditFailed

        fail_above = values.pop("fail_above", None)
        model_values = {key: values.pop(key) for key in MODEL_KEYS}
        if values["from_path"] is not None:
            refuse_with_from(model_values, MODEL_DEFAULTS)
        options = model_options(*model_values.values())
        resume = resume_arg(values.pop("resume"), values.pop("recompute"))
        spec, result, outputs = _run_audit_command(
            command, options=options, resume=resume, fail_above=fail_above, **values
        )
        if not gate:
            _report(command, spec, result, outputs, values["as_json"])
            return
        failed = [] if fail_above is None else exceeding(result.summary, fail_above)
        extra = {"fail_above": fail_above, "failed": failed}
        _report(command, spec, result, outputs, values["as_json"], extra)
        if failed:
            raise AuditFailed(f"mean B_shared(C) above {fail_above}%: {', '.join(failed)}")

    audit_command.__doc__ = doc
    audit_command.__name__ = command
    audit_command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        _audit_parameters(command, gate), return_annotation=None
    )
    app.command(command)(user_errors(audit_command))


_register_audit_command(
    "bshared",
    """Shared control bottleneck B_shared(C) = lambda_1 / tr(C C^T) per model and seed (SPEC §3).

    Reports mean ± SE over seeds (in %), R(C), and with several models the same-seed
    paired differences against the first model (mean ± SE, negatives, 95% t-interval,
    SD of Δ and the seeds needed to detect --detect at 80% power). Beside the plain
    numbers: B_shared and R of the noise-corrected Gram (*_unbiased, docs/bshared.md) and
    a bootstrap interval over probe samples for every per-seed value.
    """,
    gate=True,
)
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
        int,
        typer.Option("--families", "-M", max=MAX_FAMILIES, help="Number of families M (rows)."),
    ] = 3,
    gates: Annotated[
        int | None,
        typer.Option(
            "--gates",
            "-K",
            max=MAX_GATES,
            help="Number of gates K (columns); default: K of --model.",
        ),
    ] = None,
    trials: Annotated[
        int,
        typer.Option("--trials", "-T", max=MAX_TRIALS, help="Number of random matrices T."),
    ] = 50_000,
    seed: Annotated[int, typer.Option("--seed", min=0, max=SEED_MAX, help="RNG seed.")] = 0,
    value: Annotated[
        float | None,
        typer.Option("--value", help="A measured B_shared in percent: report its percentile."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", "-m", help="Take K from this model (its gates at --granularity)."),
    ] = None,
    granularity: GranularityOpt = None,
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
    from cdscope.commands.random_ref import run_random_reference
    from cdscope.output.render import random_ref_table

    result, target = run_random_reference(
        out, plot, families, gates, trials, seed, None if value is None else value / 100, model,
        granularity,
    )  # fmt: skip
    stats = result.stats
    if as_json:
        print_json("random-ref", {}, **stats, outputs={"samples": str(target)})
    else:
        out_console.print(random_ref_table(stats))
    wrote(err_console, f"{target}" + (f" and {plot}" if plot else ""))
