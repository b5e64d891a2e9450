"""Running an audit end to end: obtain the probe frame, evaluate it, write one set.

``run_audit`` (the CLI's bshared / acg / decompose) measures the models into
``OUT.probe.parquet`` (``collect_control``) or reads an earlier probe file (``--from``),
evaluates the measures (``audit.evaluate_audit``) and writes ``OUT``, its summary and
convergence, the probe file and the figure as one output set (``audit_outputs``,
``cdscope.fileset``): a run that fails or is killed leaves the earlier set as it was,
and a second writer of the same output is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope.commands.audit import AuditResult, AuditSpec, evaluate_audit, sibling
from cdscope.commands.audit_inputs import read_probe_frame
from cdscope.core.probes import load_pool
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet
from cdscope.output.frames import ModelOptions
from cdscope.settings import AuditSettings, ProbeSettings


@dataclass(frozen=True)
class ProbeRequest:
    """Where the probe frame of an audit or an nsweep comes from: the ``model_specs``
    measured with ``settings`` on the pools at ``probe_paths`` into ``OUT.probe.parquet``
    (``resume``: False, True or 'recompute'), or the earlier probe file ``from_path``
    (``explicit``: the settings the user gave, checked against that file's)."""

    out: Path
    model_specs: list[str] | None
    settings: ProbeSettings
    from_path: Path | None = None
    probe_paths: list[Path] | None = None
    options: ModelOptions = ModelOptions()
    resume: bool | str = False
    explicit: dict[str, object] | None = None

    @property
    def source(self) -> str:
        """What the outputs' metadata records as the numbers' origin."""
        return str(self.from_path) if self.from_path else "measured"


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
    if len(pool.families) < 2:
        raise CdscopeError(
            f"B_shared needs at least 2 task families (M >= 2); the probe has {len(pool.families)}: "
            f"{', '.join(pool.families)}"
        )
    from cdscope.commands.probe import collect_control  # the model stack, only when measuring

    return collect_control(
        request.model_specs or [], pool, request.settings, sibling(request.out, "probe"),
        request.options, request.resume, console, command, outputs=outputs,
    )  # fmt: skip


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
            spec, probe_frame, probe_meta, console, request.source, request.out,
            audit.bootstrap, audit.detect / 100, outputs, fail_above=audit.fail_above,
        )  # fmt: skip
        if plot is not None:
            draw_audit(outputs.path(plot), result)
    return result
