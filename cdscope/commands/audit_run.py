"""Running an audit end to end: obtain the probe frame, evaluate it, write one set.

``run_audit`` (the CLI's bshared / acg / decompose) measures the models into
``OUT.probe.parquet`` (``collect_control``) or reads an earlier probe file (``--from``),
evaluates the measures (``audit.evaluate_audit``) and writes ``OUT``, its summary and
convergence, the probe file and the figure as one output set (``audit_outputs``,
``cdscope.fileset``): a run that fails or is killed leaves the earlier set as it was,
and a second writer of the same output is refused.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope.commands.audit import DETECT, AuditResult, AuditSpec, evaluate_audit, sibling
from cdscope.commands.audit_inputs import read_probe_frame
from cdscope.core.probes import load_pool
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet
from cdscope.output.frames import ModelOptions, ProbeSettings


def obtain_probe_frame(
    command: str,
    out: Path,
    model_specs: list[str] | None,
    from_path: Path | None,
    settings: ProbeSettings,
    probe_paths: list[Path] | None,
    options: ModelOptions,
    resume: bool | str,
    console: Console,
    explicit: dict[str, object] | None = None,
    outputs: FileSet | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Read the ``--from`` probe file, or measure the models into ``OUT.probe.parquet``
    (a file of the output set ``outputs``)."""
    if from_path is not None:
        if model_specs:
            raise CdscopeError("--from reads an existing probe file: do not also pass --model")
        probe_frame, probe_meta = read_probe_frame(from_path, explicit or {})
    else:
        pool = load_pool(probe_paths)
        if len(pool.families) < 2:
            raise CdscopeError(
                f"B_shared needs at least 2 task families (M >= 2); the probe has {len(pool.families)}: "
                f"{', '.join(pool.families)}"
            )
        from cdscope.commands.probe import collect_control  # the model stack, only when measuring

        probe_frame, probe_meta = collect_control(
            model_specs or [],
            pool,
            settings,
            sibling(out, "probe"),
            options,
            resume,
            console,
            command,
            outputs=outputs,
        )
    return probe_frame, probe_meta


def audit_outputs(out: Path, measured: bool, plot: Path | None = None) -> FileSet:
    """The output set of an audit: ``OUT``, its summary and convergence, the probe file
    when the models are measured, and the figure (with its ``.units`` sibling)."""
    from cdscope.commands.audit_plot import units_plot_path

    figures = [plot, units_plot_path(plot)] if plot is not None else []
    probe = [sibling(out, "probe")] if measured else []
    return FileSet(out, sibling(out, "summary"), sibling(out, "convergence"), *probe, *figures)


def run_audit(
    spec: AuditSpec,
    out: Path,
    model_specs: list[str] | None,
    from_path: Path | None,
    settings: ProbeSettings,
    probe_paths: list[Path] | None,
    options: ModelOptions,
    resume: bool | str,
    console: Console,
    explicit: dict[str, object] | None = None,
    bootstrap: int = 1000,
    detect: float = DETECT,
    plot: Path | None = None,
    fail_above: float | None = None,
) -> AuditResult:
    """Measure (or read) the probe frame, evaluate ``spec``'s measures and write every
    output, the figure at ``plot`` included, as one set (``audit_outputs``): a run that
    fails leaves the earlier set as it was. ``fail_above``, the CI gate's threshold in
    percent, is recorded in the outputs' metadata."""
    from cdscope.commands.audit_plot import draw_audit

    with audit_outputs(out, from_path is None, plot) as outputs:
        probe_frame, probe_meta = obtain_probe_frame(
            spec.command, out, model_specs, from_path, settings, probe_paths, options, resume,
            console, explicit, outputs,
        )  # fmt: skip
        source = str(from_path) if from_path else "measured"
        result = evaluate_audit(
            spec, probe_frame, probe_meta, console, source, out, bootstrap, detect, outputs,
            fail_above=fail_above,
        )
        if plot is not None:
            draw_audit(outputs.path(plot), result)
    return result
