"""The probe frame: long-format schema and the settings that define a measurement.

Light on purpose (numpy and pandas only): commands that only read an existing probe
file (``--from``) import this, not the model stack.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pandas as pd

from cdscope.analysis.uncertainty import FamilySamples

# ProbeSettings lives in cdscope.settings (light: the CLI reads its defaults without numpy);
# bound here too because the Python API and older code import it from this module
from cdscope.settings import ProbeSettings  # noqa: F401
from cdscope.settings.names import SUBLAYER

FRAME_COLUMNS = [
    "model",
    "seed",
    "family",
    "gate",
    "layer",
    SUBLAYER,
    "unit",
    "C",
    "F",
    "dl_dg",
    "ell",
    "dropped",
]
#: Optional per-sample columns (docs/decisions.md): on each (family, gate) row, lists in
#: probe order with one entry per sample i of the family -- log pi_i (repeated on every
#: gate row), d log pi_i / d g_k and F_i[k]. Files written before they existed lack them;
#: measures that need them are then reported as unavailable.
SAMPLE_COLUMNS = ["logp_samples", "dlogp_samples", "F_samples"]
#: Column ``unit`` (nullable Int64): the head / expert / neuron index of a gate at a finer
#: granularity, null for a gate on a whole write; files from before it lack it (all null).
UNIT_COLUMN = "unit"


def describe_seeds(seeds: Sequence[int]) -> str:
    """Compact metadata for a seed list: ``'0..999'`` for a contiguous ascending range
    (every list cdscope makes), else its count and a hash (never the whole list)."""
    seeds = [int(s) for s in seeds]
    if seeds and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}..{seeds[-1]}"
    digest = hashlib.sha256(",".join(map(str, seeds)).encode()).hexdigest()[:16]
    return f"{len(seeds)} seeds, sha256:{digest}"


def control_matrices(
    frame: pd.DataFrame, value: str = "C"
) -> dict[tuple[str, int], tuple[list[str], np.ndarray]]:
    """Long frame -> {(model, seed): (kept families, [M, K] matrix of ``value``)}; dropped rows excluded."""
    matrices = {}
    kept = frame[~frame["dropped"]]
    for (model, seed), group in kept.groupby(["model", "seed"], sort=False):
        wide = group.pivot(index="family", columns="gate", values=value).sort_index()
        matrices[(model, int(seed))] = (list(wide.index), wide.to_numpy())
    return matrices


def sample_sets(
    frame: pd.DataFrame,
) -> dict[tuple[str, int], tuple[list[str], list[FamilySamples]] | None]:
    """Long frame -> {(model, seed): (kept families sorted, their samples)}, or None for a
    (model, seed) whose rows lack the per-sample columns (an older file)."""
    out: dict[tuple[str, int], tuple[list[str], list[FamilySamples]] | None] = {}
    has_columns = all(c in frame.columns for c in SAMPLE_COLUMNS)
    kept = frame[~frame["dropped"].astype(bool)]
    for (model, seed), group in kept.groupby(["model", "seed"], sort=False):
        key = (model, int(seed))
        if not has_columns or group[SAMPLE_COLUMNS].isna().any().any():
            out[key] = None
            continue
        families, sets = [], []
        for family, rows in group.sort_values(["family", "gate"]).groupby("family", sort=True):
            families.append(str(family))
            sets.append(
                FamilySamples(
                    np.asarray(rows["logp_samples"].iloc[0], dtype=np.float64),
                    np.stack([np.asarray(v, dtype=np.float64) for v in rows["dlogp_samples"]], 1),
                    np.stack([np.asarray(v, dtype=np.float64) for v in rows["F_samples"]], 1),
                )
            )
        out[key] = (families, sets)
    return out
