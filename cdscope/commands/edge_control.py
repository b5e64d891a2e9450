"""Edge-level control as a workflow: probe frame, concentration table, figure (issue 15).

For every model and probe seed: draw n items per family (SPEC §4), encode them, run
``cdscope.edge_control.control_edges`` (C over the E = 4L^2 + 3L + 1 edges of SPEC §6)
and append one row per (model, seed, family, edge) to the ordinary probe frame, plus
the edge's ``upstream``, ``downstream`` and ``path``. ``out`` is rewritten atomically
after each seed. The concentration of each control vector C[m, :] is summarised by

    PR(C[m,:]) = (sum_e |C[m,e]|)^2 / sum_e C[m,e]^2              (SPEC §3, 1 .. E)
    edges_q    = smallest number of edges whose |C| carry a fraction q of sum_e |C[m,e]|

and drawn by ``cdscope.plots_edges.plot_edge_concentration``. Python use::

    from cdscope.commands.edge_control import edge_probe
    frame, metadata = edge_probe(["embedded"], pool, ProbeSettings(seeds=(0, 1)),
                                 out=Path("edges.parquet"), plot=Path("edges.png"))
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from cdscope.batch import encode_probe
from cdscope.commands.probe import (
    dropped_warning,
    model_record,
    probe_metadata,
    record_drawn,
    result_frame,
)
from cdscope.control import ControlResult
from cdscope.errors import CdscopeError
from cdscope.frames import ModelOptions, ProbeSettings, control_matrices
from cdscope.io import write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.models import LoadedModel
from cdscope.probes import ProbePool, draw_probe
from cdscope.spectral import cumulative_mass, participation_ratio

EDGE_COLUMNS = ["upstream", "downstream", "path"]
MASS_LEVELS = (0.5, 0.9)


def edge_frame(model: str, seed: int, result: ControlResult) -> pd.DataFrame:
    """The probe frame of an edge-granularity result, with each edge's endpoints and path."""
    frame = result_frame(model, seed, result)
    M = len(result.families)  # noqa: N806
    gates = result.gate_set
    for column, values in zip(
        EDGE_COLUMNS, (gates.upstream, gates.downstream, gates.paths), strict=True
    ):
        frame[column] = np.tile(values, M)
    return frame


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


def measure_edges(loaded: LoadedModel, pool: ProbePool, seed: int, settings: ProbeSettings):  # noqa: ANN201
    """One probe seed on one model at edge granularity (a ``ControlResult``)."""
    from cdscope.edge_control import control_edges

    items = draw_probe(pool, seed, settings.n)
    pad_id = getattr(loaded.tokenizer, "pad_token_id", None) or 0
    batch = encode_probe(items, loaded.tokenizer, settings.template, pad_id=pad_id)
    batch_size = settings.batch_size or (1 if loaded.device.type == "cpu" else None)
    return control_edges(loaded.model, batch.to(loaded.device), batch_size)


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
    if settings.estimator != "autograd":
        raise CdscopeError("edge granularity has only the autograd estimator: drop --estimator fd")
    console = console or make_console()
    metadata = probe_metadata("edge-control", pool, settings, options, world_size=1)
    metadata["granularity"] = "edge"
    frames: list[pd.DataFrame] = []
    with progress_bar(console) as progress:
        task = progress.add_task("edge control", total=len(model_specs) * len(settings.seeds))
        for given in model_specs:
            loaded = given if isinstance(given, LoadedModel) else options.load(given, console)
            for seed in settings.seeds:
                progress.update(task, description=f"{loaded.name} seed {seed}")
                result = measure_edges(loaded, pool, seed, settings)
                if result.dropped:
                    dropped_warning(console, loaded.name, seed, result.dropped)
                record = model_record(loaded, result)  # reads only .gate_set
                metadata["models"] = [m for m in metadata["models"] if m["name"] != loaded.name] + [
                    record
                ]
                frames.append(edge_frame(loaded.name, seed, result))
                frame = pd.concat(frames, ignore_index=True)
                record_drawn(metadata, pool, settings.n, frame["seed"])
                if out is not None:
                    write_parquet(frame, out, metadata)
                progress.advance(task)
    frame = pd.concat(frames, ignore_index=True)
    if plot is not None:
        from cdscope.plots_edges import plot_edge_concentration

        plot_edge_concentration(plot, frame, concentration(frame))
    return frame, metadata
