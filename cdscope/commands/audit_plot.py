"""The figures of ``bshared``, ``acg`` and ``decompose`` (the same for ``--plot`` and
``cdscope.plot``): drawn from an ``AuditResult`` after the engine (audit.py) has run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cdscope.output.frames import UNIT_COLUMN

if TYPE_CHECKING:  # the engine draws through this module (run_audit), not the reverse
    from cdscope.commands.audit import AuditResult


def units_plot_path(path: Path) -> Path:
    """``fig.png`` -> ``fig.units.png``: the unit figure beside an audit's figure."""
    return path.with_name(f"{path.stem}.units{path.suffix}")


def draw_audit(path: Path, result: AuditResult) -> None:
    """The figure of each audit command (the same for ``--plot`` and ``cdscope.plot``);
    when the gates are finer than whole writes, also the unit figure
    (``plots_units.plot_units``: |C| mass curves, layer x head heatmaps) beside it."""
    from cdscope.output.plots import plot_audit, plot_decompose

    frame = result.probe_frame
    if UNIT_COLUMN in frame.columns and frame[UNIT_COLUMN].notna().any():
        from cdscope.output.plots_units import plot_units

        plot_units(units_plot_path(path), frame)
    if result.command == "decompose":
        plot_decompose(path, result.per_seed, result.summary)
        return
    measures, title = {
        "bshared": (["B_shared_C"], "B_shared(C)"),
        "acg": (["B_shared_F", "B_shared_C", "ACG"], "Activation vs control"),
    }[result.command]
    plot_audit(path, title, result.per_seed, result.summary, result.paired, measures)
