"""Inputs of the audit engine checked before any measure is evaluated (SPEC §3, §4).

``read_probe_frame`` reads a ``probe`` Parquet for ``--from`` and refuses, in one line,
a file cdscope could not have written (``check_probe_file``: integer seeds and gates,
boolean ``dropped``, one row per (model, seed, family, gate), a complete family x gate
grid, finite l_m, dl/dg, F and kept C) or one measured with other settings than the
options asked for; ``check_probe_frame`` checks the schema (``FRAME_COLUMNS``) of a
frame handed to the engine from Python. numpy/pandas only: ``--from`` never loads torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cdscope.errors import CdscopeError
from cdscope.io import read_parquet
from cdscope.output.frames import FRAME_COLUMNS, UNIT_COLUMN


def read_probe_frame(path: Path, expect: dict[str, object]) -> tuple[pd.DataFrame, dict]:
    """A ``probe`` Parquet for ``--from``: schema and explicitly requested settings checked."""
    frame, metadata = read_parquet(path)
    check_probe_frame(frame, str(path))
    check_probe_file(frame, metadata, path)
    settings = {"granularity": "sublayer", **metadata["settings"]}  # older files: sublayer
    for key, wanted in expect.items():
        if wanted is not None and settings.get(key) != wanted:
            raise CdscopeError(
                f"{path} was measured with {key}={settings.get(key)!r} but --{key} {wanted} was asked; "
                "drop the option or measure again"
            )
    return frame, metadata


def check_probe_file(frame: pd.DataFrame, metadata: dict, path: Path) -> None:
    """Refuse a probe file whose columns or metadata cdscope could not have written:
    non-integer seeds or gates, non-boolean ``dropped``, a NaN/inf in l_m, dl/dg, F or
    in C of a kept family (naming the first), metadata without settings/models."""
    if not isinstance(metadata.get("settings"), dict) or not isinstance(
        metadata.get("models", []), list
    ):
        raise CdscopeError(f"{path}: its metadata has no settings/models; not a probe file")
    for column in ("seed", "gate"):
        if not pd.api.types.is_integer_dtype(frame[column]):
            raise CdscopeError(
                f"{path}: column {column!r} holds {frame[column].dtype} values, not integers"
            )
    if not pd.api.types.is_bool_dtype(frame["dropped"]):
        raise CdscopeError(f"{path}: column 'dropped' holds {frame['dropped'].dtype}, not booleans")
    for column in ("seed", "gate", "dropped"):  # nullable types (cdscope.schemas) may hold nulls
        if frame[column].isna().any():
            raise CdscopeError(f"{path}: column {column!r} has missing values; measure again")
    keys = ["model", "seed", "family", "gate"]
    duplicated = frame.duplicated(keys)
    if duplicated.any():
        row = frame[duplicated].iloc[0]
        raise CdscopeError(
            f"{path}: (model, seed, family, gate) = ({row['model']!r}, {row['seed']}, "
            f"{row['family']!r}, {row['gate']}) appears twice; measure again"
        )
    grid = frame.groupby(["model", "seed"])[["family", "gate"]].nunique()
    sizes = frame.groupby(["model", "seed"]).size()
    incomplete = sizes != grid["family"] * grid["gate"]
    if incomplete.any():
        model, seed = incomplete[incomplete].index[0]
        raise CdscopeError(
            f"{path}: model {model!r} seed {seed} lacks some (family, gate) rows; measure again"
        )
    kept = ~frame["dropped"]
    for column, rows in (("ell", None), ("dl_dg", None), ("F", None), ("C", kept)):
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values) if rows is None else ~np.isfinite(values) & rows.to_numpy()
        if bad.any():
            row = frame.iloc[int(np.flatnonzero(bad)[0])]
            raise CdscopeError(
                f"{path}: {column} of family {row['family']!r} at seed {row['seed']} of model "
                f"{row['model']!r} is not a finite number ({row[column]!r}); measure again"
            )


def check_probe_frame(frame: object, what: str = "the probe frame") -> pd.DataFrame:
    """``frame`` must be a DataFrame with the probe schema (FRAME_COLUMNS); one-line refusal."""
    if not isinstance(frame, pd.DataFrame):
        raise CdscopeError(
            f"{what} must be a pandas DataFrame from cdscope.measure, got {type(frame).__name__}"
        )
    missing = [c for c in FRAME_COLUMNS if c not in frame.columns and c != UNIT_COLUMN]
    if missing:
        raise CdscopeError(
            f"{what} is not a probe file/frame (missing column(s) {', '.join(missing)}); pass "
            "the frame cdscope.measure returns or the .probe.parquet of probe/bshared/acg/decompose"
        )
    return frame
