"""The figures of ``bshared``, ``acg`` and ``decompose`` (the same for ``--plot`` and
``cdscope.plot``): drawn from an ``AuditResult`` after the engine (audit.py) has run.

bshared shows B_shared(C) and, where the probe carried per-sample data, the
noise-corrected B_shared(C) beside it (docs/bshared.md): the plain value is the
paper-comparable one, the corrected one is what the sampling noise leaves.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cdscope.output.frames import UNIT_COLUMN

if TYPE_CHECKING:  # the engine draws through this module (run_audit), not the reverse
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from cdscope.commands.audit import AuditResult


def units_plot_path(path: Path) -> Path:
    """``fig.png`` -> ``fig.units.png``: the unit figure beside an audit's figure."""
    return path.with_name(f"{path.stem}.units{path.suffix}")


def audit_figure(result: AuditResult, ax: Axes | None = None) -> Figure:
    """The figure of ``result`` (``ax``: its first panel on the caller's Axes)."""
    from cdscope.commands.audit import AUDITS
    from cdscope.output import plots

    spec = AUDITS[result.command]
    measures = list(spec.plot_measures)
    if result.command == "decompose":
        return plots.decompose_figure(result.per_seed, result.summary, measures, spec.title, ax)
    return plots.audit_figure(
        spec.title, result.per_seed, result.summary, result.paired, measures, ax
    )


def draw_audit(path: Path | None, result: AuditResult, ax: Axes | None = None) -> Figure:
    """The figure of each audit command (the same for ``--plot`` and ``cdscope.plot``),
    written to ``path`` when given; when the gates are finer than whole writes, also the
    unit figure (``plots_units.units_figure``: |C| mass curves, layer x head heatmaps)
    beside it."""
    from cdscope.output.plots import save_figure

    fig = audit_figure(result, ax)
    if path is None:
        return fig
    frame = result.probe_frame
    if UNIT_COLUMN in frame.columns and frame[UNIT_COLUMN].notna().any():
        from cdscope.output.plots_units import plot_units

        plot_units(units_plot_path(path), frame)
    save_figure(fig, path)
    return fig
