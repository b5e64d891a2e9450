"""bshared, acg, decompose: one audit engine, one registered factory (SPEC §3-4)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated

import typer

from cdscope.cli.common import (
    FromOpt,
    JsonOpt,
    ModelOpt,
    PlotOpt,
    ProbeOpt,
    RecomputeOpt,
    ResumeOpt,
    app,
    err_console,
    models_or_embedded,
    out_console,
    print_json,
    refuse_with_from,
    resume_arg,
    user_errors,
)
from cdscope.cli.options import annotated, with_settings
from cdscope.messages import wrote
from cdscope.settings import AuditSettings, ModelSettings, ProbeSettings


def audit_request(values: dict, model_settings: ModelSettings):  # noqa: ANN201 - ProbeRequest
    """The probe request of bshared / acg / decompose from their option values: unset
    probe options take ``ProbeSettings``' defaults, and with ``--from`` every option about
    measuring (seeds, probe, batch size, resume, the model options) is refused."""
    from cdscope.commands.requests import ProbeRequest
    from cdscope.core.models.opening import ModelOptions
    from cdscope.io import check_parquet_output

    from_path, resume = values["from_path"], resume_arg(values["resume"], values["recompute"])
    if from_path is not None:
        given = ("resume", "seeds", "probe", "batch_size", "probe_split")
        measuring = {key: True for key in given if values[key]}
        refuse_with_from(measuring | model_settings.changed())
    explicit = {key: values[key] for key in ("n", "template", "granularity")}
    settings = ProbeSettings(
        tuple(range(values["seeds"] or AuditSettings.seeds)),
        **{key: value for key, value in explicit.items() if value is not None},
        batch_size=values["batch_size"],
        probe_split=values["probe_split"] or ProbeSettings.probe_split,
    )
    return ProbeRequest(
        out=check_parquet_output(values["out"]),
        model_specs=models_or_embedded(values["model"]) if from_path is None else values["model"],
        settings=settings, from_path=from_path, probe_paths=values["probe"],
        options=ModelOptions.from_settings(model_settings), resume=resume, explicit=explicit,
    )  # fmt: skip


def outputs_by_name(request, plot: Path | None, result) -> dict[str, str]:  # noqa: ANN001
    """What an audit wrote, by name (``--json``'s ``outputs`` and the closing lines)."""
    from cdscope.commands.audit import sibling

    out = request.out
    outputs = {
        "per_seed": str(out),
        "summary": str(sibling(out, "summary")),
        "convergence": str(sibling(out, "convergence")),
    }
    if request.from_path is None:
        outputs["probe"] = str(sibling(out, "probe"))
    if plot is not None:
        outputs["plot"] = str(plot)
        frame = result.probe_frame
        if "unit" in frame.columns and frame["unit"].notna().any():
            from cdscope.commands.audit_plot import units_plot_path

            outputs["units_plot"] = str(units_plot_path(plot))
    return outputs


def _report(spec, result, outputs: dict, as_json: bool, extra: dict | None = None) -> None:  # noqa: ANN001
    from cdscope.output.render import audit_table, convergence_table, per_seed_table

    if as_json:
        tables = {
            "summary": result.summary,
            "paired": result.paired,
            "per_seed": result.per_seed,
            "convergence": result.convergence,
        }
        print_json(
            spec.command,
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
            audit_table(
                result.summary, result.paired, f"cdscope {spec.command}: mean ± SE over seeds"
            )
        )
        if not result.convergence.empty:
            out_console.print(convergence_table(result.convergence))
    for name, path in outputs.items():
        wrote(err_console, f"{name}: {path}")


def _audit_parameters(command: str, gate: bool) -> list[inspect.Parameter]:
    """The options of bshared, acg and decompose other than the model options, declared
    once in help order; ``gate`` adds bshared's CI gate (--fail-above) after --json.
    Unset probe options are None (``--from`` checks the file's against the given ones)."""
    out_opt = Annotated[
        Path,
        typer.Option("--out", "-o", help="Per-seed Parquet; OUT.summary/.probe.parquet beside it."),
    ]
    gate_opt = [("fail_above", annotated(AuditSettings, "fail_above"), None)] if gate else []
    declared = [
        ("model", ModelOpt, None), ("seeds", annotated(AuditSettings, "seeds", unset=True, in_sentence=True), None),
        ("n", annotated(ProbeSettings, "n", unset=True, in_sentence=True), None),
        ("probe", ProbeOpt, None),
        ("probe_split", annotated(ProbeSettings, "probe_split", unset=True, in_sentence=True), None),
        ("template", annotated(ProbeSettings, "template", unset=True, in_sentence=True), None),
        ("out", out_opt, Path(f"results/{command}.parquet")), ("plot", PlotOpt, None),
        ("as_json", JsonOpt, False), *gate_opt,
        ("from_path", FromOpt, None), ("resume", ResumeOpt, False),
        ("recompute", RecomputeOpt, False),
        ("batch_size", annotated(ProbeSettings, "batch_size"), None),
        ("granularity", annotated(ProbeSettings, "granularity", unset=True, in_sentence=True), None),
        ("bootstrap", annotated(AuditSettings, "bootstrap"), AuditSettings.bootstrap),
        ("detect", annotated(AuditSettings, "detect"), AuditSettings.detect),
    ]  # fmt: skip
    kind = inspect.Parameter.KEYWORD_ONLY
    return [inspect.Parameter(name, kind, default=d, annotation=a) for name, a, d in declared]


def _register_audit_command(command: str, doc: str, gate: bool = False) -> None:
    """One factory for bshared, acg and decompose: the same options and body; bshared
    (``gate``) also takes --fail-above and exits 1 when a model's mean of the audit's
    gated measure (``AuditSpec.gated``) is above."""

    def audit_command(model_settings: ModelSettings, **values: object) -> None:
        from cdscope.commands.audit import AUDITS, exceeding
        from cdscope.commands.audit_run import run_audit
        from cdscope.errors import AuditFailed
        from cdscope.io import check_plot_path

        spec = AUDITS[command]
        audit = AuditSettings(
            bootstrap=values["bootstrap"], detect=values["detect"],
            fail_above=values.get("fail_above"),
        )  # fmt: skip
        request = audit_request(values, model_settings)
        plot = values["plot"]
        if plot is not None:
            check_plot_path(plot)
        result = run_audit(spec, request, err_console, audit, plot)
        outputs = outputs_by_name(request, plot, result)
        if not gate:
            _report(spec, result, outputs, values["as_json"])
            return
        failed = [] if audit.fail_above is None else exceeding(result.summary, audit.fail_above)
        extra = {"fail_above": audit.fail_above, "failed": failed}
        _report(spec, result, outputs, values["as_json"], extra)
        if failed:
            raise AuditFailed(
                f"mean {spec.gated_label} above {audit.fail_above}%: {', '.join(failed)}"
            )

    audit_command.__doc__ = doc
    audit_command.__name__ = command
    audit_command.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            inspect.Parameter("model_settings", inspect.Parameter.KEYWORD_ONLY),
            *_audit_parameters(command, gate),
        ],
        return_annotation=None,
    )
    audit_command.__annotations__ = {}
    app.command(command)(user_errors(with_settings(ModelSettings, "model_settings")(audit_command)))


_register_audit_command(
    "bshared",
    """Shared control bottleneck B_shared(C) = lambda_1 / tr(C C^T) per model and seed (SPEC §3).

    Reports mean ± SE over seeds (in %), R(C), and with several models the same-seed
    paired differences against the first model (mean ± SE, negatives, 95% t-interval,
    SD of Δ and the seeds needed to detect the target --detect at 80% power, with its
    range from the SD's chi-square interval). Beside the plain numbers: B_shared and R of
    the noise-corrected Gram (*_unbiased, with the eigenvalue mass clipped to read it; an
    estimator of another quantity, not comparable with the plain one; docs/bshared.md) and
    the bootstrap spread over probe samples of every per-seed value (not a confidence
    interval).
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
