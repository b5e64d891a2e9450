"""The figures of ``bshared``, ``acg`` and ``decompose`` (the same for ``--plot`` and
``cdscope.plot``): drawn from an ``AuditResult`` after the engine (audit.py) has run.

bshared shows B_shared(C) and, where the probe carried per-sample data, the
noise-corrected B_shared(C) beside it (docs/bshared.md): the plain value is the
paper-comparable one, the corrected one is what the sampling noise leaves. Under each
model's plain B_shared(C) bar: the random reference of its M x K (SPEC §4; mean to p95 of
``BAND_TRIALS`` Gaussian matrices), and over the gated measure the run's ``--fail-above``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cdscope.output.frames import UNIT_COLUMN

if TYPE_CHECKING:  # the engine draws through this module (run_audit), not the reverse
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from cdscope.commands.audit import AuditResult


#: trials behind the figure's random-reference band (p95 within ~0.2 points at K = 60;
#: ``cdscope random-ref`` draws the full distribution)
BAND_TRIALS = 2_000


def measured_shapes(result: AuditResult) -> dict[str, tuple[int, int]]:
    """model -> (M, K) of its C: from the probe frame (M the families kept on most seeds, K
    its gates), or, for an audit read back from its files (``cdscope report``), from the
    probe metadata it recorded (the probe's families, each model's K)."""
    frame = result.probe_frame
    if len(frame):
        kept = frame[~frame["dropped"].astype(bool)]
        shapes = {}
        for model, part in kept.groupby("model", sort=False):
            per_seed = part.groupby("seed").agg(M=("family", "nunique"), K=("gate", "nunique"))
            shapes[str(model)] = tuple(int(v) for v in per_seed.value_counts().idxmax())
        return shapes  # type: ignore[return-value]
    probe = result.metadata.get("probe") or {}
    families = len(probe.get("families") or [])
    return {
        str(record["name"]): (families, int(record["K"]))
        for record in probe.get("models") or []
        if isinstance(record, dict) and "name" in record and isinstance(record.get("K"), int)
    }


def random_bands(result: AuditResult) -> dict[str, tuple[float, float, str]]:
    """model -> (mean, p95, 'M×K') of B_shared over Gaussian M x K matrices (SPEC §4) of
    its measured shape (``measured_shapes``): what a plain B_shared(C) gives by chance."""
    from cdscope.analysis.spectral import random_reference

    bands, drawn = {}, {}
    for model, (M, K) in measured_shapes(result).items():  # noqa: N806
        if M < 2 or K < 1:
            continue
        if (M, K) not in drawn:
            drawn[M, K] = random_reference(M, K, BAND_TRIALS, seed=0)
        bands[model] = (drawn[M, K].mean, drawn[M, K].p95, f"{M}×{K}")
    return bands


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
    bands = random_bands(result) if plots.RANDOM_MEASURE in measures else {}
    marks = plots.BarMarks(bands, result.metadata.get("fail_above"), spec.gated)
    return plots.audit_figure(
        spec.title, result.per_seed, result.summary, result.paired, measures, ax, marks
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
