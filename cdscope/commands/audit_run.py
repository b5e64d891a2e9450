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

from cdscope.commands.audit import AuditResult, AuditSpec, evaluate_audit, sibling
from cdscope.commands.audit_inputs import read_probe_frame, require_families
from cdscope.commands.requests import ProbeRequest, ProbeRun
from cdscope.core.probes import load_pool
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet
from cdscope.settings import AuditSettings


def obtain_probe_frame(
    command: str, request: ProbeRequest, console: Console, outputs: FileSet | None = None
) -> tuple[pd.DataFrame, dict]:
    """Read the ``--from`` probe file, or measure the models into ``OUT.probe.parquet``
    (a file of the output set ``outputs``)."""
    if request.from_path is not None:
        if request.model_specs:
            raise CdscopeError("--from reads an existing probe file: do not also pass --model")
        return read_probe_frame(request.from_path, request.explicit or {})
    pool = load_pool(request.probe_paths)
    require_families(pool.families, "the probe")
    from cdscope.commands.probe import collect_control  # the model stack, only when measuring

    run = ProbeRun(
        request.model_specs or [], pool, request.settings, sibling(request.out, "probe"),
        request.options, request.resume, command,
    )  # fmt: skip
    return collect_control(run, console, outputs=outputs)


def audit_outputs(out: Path, measured: bool, plot: Path | None = None) -> FileSet:
    """The output set of an audit: ``OUT``, its summary and convergence, the probe file
    when the models are measured, and the figure (with its ``.units`` sibling)."""
    from cdscope.commands.audit_plot import units_plot_path

    figures = [plot, units_plot_path(plot)] if plot is not None else []
    probe = [sibling(out, "probe")] if measured else []
    return FileSet(out, sibling(out, "summary"), sibling(out, "convergence"), *probe, *figures)


def run_audit(
    spec: AuditSpec,
    request: ProbeRequest,
    console: Console | None = None,
    audit: AuditSettings = AuditSettings(),
    plot: Path | None = None,
) -> AuditResult:
    """Measure (or read) the probe frame, evaluate ``spec``'s measures and write every
    output, the figure at ``plot`` included, as one set (``audit_outputs``): a run that
    fails leaves the earlier set as it was. ``audit.fail_above``, the CI gate's threshold
    in percent, is recorded in the outputs' metadata."""
    from cdscope.commands.audit_plot import draw_audit
    from cdscope.messages import make_console

    console = console or make_console()
    with audit_outputs(request.out, request.from_path is None, plot) as outputs:
        probe_frame, probe_meta = obtain_probe_frame(spec.command, request, console, outputs)
        result = evaluate_audit(
            spec, probe_frame, probe_meta, console, source=request.source, out=request.out,
            audit=audit, outputs=outputs,
        )  # fmt: skip
        if plot is not None:
            draw_audit(outputs.path(plot), result)
    return result
