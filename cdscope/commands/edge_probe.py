"""Edge-level control as a workflow: probe frame, concentration table, figure (issue 15).

For every model and probe seed: draw n items per family (SPEC §4), encode them, run
``cdscope.core.edge_control.control_edges`` (C over the E = 4L^2 + 3L + 1 edges of SPEC §6)
and append one row per (model, seed, family, edge) to the ordinary probe frame, plus
the edge's ``upstream``, ``downstream`` and ``path`` — ``probe --granularity edge``, whose
workflow (``collect_control``: resume, atomic rewrite after each seed) this calls. The concentration of each control vector C[m, :] is summarised by

    PR(C[m,:]) = (sum_e |C[m,e]|)^2 / sum_e C[m,e]^2              (SPEC §3, 1 .. E)
    edges_q    = smallest number of edges whose |C| carry a fraction q of sum_e |C[m,e]|

and drawn by ``cdscope.output.plots_edges.plot_edge_concentration``. Python use::

    from cdscope.commands.edge_probe import edge_probe
    frame, metadata = edge_probe(["embedded"], pool, ProbeSettings(seeds=(0, 1)),
                                 out=Path("edges.parquet"), plot=Path("edges.png"))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from cdscope.analysis.spectral import cumulative_mass, participation_ratio
from cdscope.commands.probe import collect_control
from cdscope.commands.requests import ProbeRun
from cdscope.core.models import LoadedModel
from cdscope.core.models.opening import ModelOptions
from cdscope.core.probes import ProbePool
from cdscope.output.frames import ProbeSettings, control_matrices
from cdscope.output.plots_edges import plot_edge_concentration
from cdscope.settings.names import EDGE

MASS_LEVELS = (0.5, 0.9)


def edges_for_mass(C: np.ndarray, q: float) -> np.ndarray:  # noqa: N803
    """``[M]``: the fewest edges whose |C[m, e]| sum to at least ``q`` of the row's total."""
    cum = cumulative_mass(C)
    return 1 + np.array([int(np.searchsorted(row, q - 1e-12)) for row in cum])


def concentration(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (model, seed, kept family): E, PR, PR / E and edges_q for q in MASS_LEVELS."""
    rows = []
    for (model, seed), (families, C) in control_matrices(frame).items():
        E = C.shape[1]  # noqa: N806
        pr = participation_ratio(C)
        counts = {q: edges_for_mass(C, q) for q in MASS_LEVELS}
        for m, family in enumerate(families):
            rows.append(
                {
                    "model": model,
                    "seed": seed,
                    "family": family,
                    "E": E,
                    "PR": pr[m],
                    "PR_fraction": pr[m] / E,
                    **{f"edges_{round(100 * q)}": int(counts[q][m]) for q in MASS_LEVELS},
                }
            )
    return pd.DataFrame(rows)


def edge_probe(
    model_specs: Sequence[str | LoadedModel],
    pool: ProbePool,
    settings: ProbeSettings,
    out: Path | None = None,
    plot: Path | None = None,
    options: ModelOptions = ModelOptions(),
    console: Console | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Edge-level C for every (model, seed); write ``out`` after each seed and ``plot``
    (the PR / cumulative-mass figure) at the end. Returns (frame, metadata)."""
    edges = replace(settings, granularity=EDGE)
    run = ProbeRun(model_specs, pool, edges, out, options, command="edge-control")
    frame, metadata = collect_control(run, console)
    if plot is not None:
        plot_edge_concentration(plot, frame, concentration(frame))
    return frame, metadata
