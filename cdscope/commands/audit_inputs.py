"""Inputs of the audit engine checked before any measure is evaluated (SPEC §3, §4).

``read_probe_frame`` reads a ``probe`` Parquet for ``--from`` and refuses, in one line,
a file cdscope could not have written (``check_probe_file``: integer seeds and gates,
boolean ``dropped``, one row per (model, seed, family, gate), a complete family x gate
grid, a family dropped on all its gates or none, finite, numeric and sane l_m, dl/dg, F, kept C and per-sample lists:
``value_problem``) or one measured with other settings than the
options asked for; ``check_probe_frame`` checks the schema (``FRAME_COLUMNS``) of a
frame handed to the engine from Python. numpy/pandas only: ``--from`` never loads torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from cdscope.core.control import EPS0
from cdscope.errors import CdscopeError
from cdscope.finite import first_unusable
from cdscope.io import read_parquet
from cdscope.output.frames import FRAME_COLUMNS, SAMPLE_COLUMNS, UNIT_COLUMN
from cdscope.settings.names import SUBLAYER


def read_probe_frame(path: Path, expect: dict[str, object]) -> tuple[pd.DataFrame, dict]:
    """A ``probe`` Parquet for ``--from``: schema and explicitly requested settings checked."""
    frame, metadata = read_parquet(path)
    check_probe_frame(frame, str(path))
    check_probe_file(frame, metadata, path)
    settings = {"granularity": SUBLAYER, **metadata["settings"]}  # older files: sublayer
    for key, wanted in expect.items():
        if wanted is not None and settings.get(key) != wanted:
            raise CdscopeError(
                f"{path} was measured with {key}={settings.get(key)!r} but --{key} {wanted} was asked; "
                "drop the option or measure again"
            )
    return frame, metadata


def check_probe_file(frame: pd.DataFrame, metadata: dict, path: Path) -> None:
    """Refuse a probe file whose columns or metadata cdscope could not have written:
    non-integer seeds or gates, non-boolean ``dropped`` or one that differs between the
    gates of a family, a NaN/inf in l_m, dl/dg, F or
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
    problem = value_problem(frame)
    if problem is not None:
        raise CdscopeError(f"{path}: {problem}; measure again")


def _where(row: pd.Series) -> str:
    return f"family {row['family']!r} at seed {row['seed']} of model {row['model']!r}"


def value_problem(frame: pd.DataFrame) -> str | None:
    """What is wrong with the measured values of a probe frame, or None: l_m, dl/dg, F and
    the C of kept families must be numbers (not strings), finite and not absurdly large
    (``finite.ABSURD``); the per-sample lists of kept families must be lists of such
    numbers, one entry per sample, the same count n on every gate row of a family; a
    family is dropped on all its gates or none (SPEC §2 drops it whole: a kept row next
    to a dropped one leaves a NaN hole in the kept C)."""
    dropped = frame["dropped"]
    kept = ~dropped.to_numpy(dtype=bool) if pd.api.types.is_bool_dtype(dropped) else None
    if kept is not None:
        mixed = frame.groupby(["model", "seed", "family"])["dropped"].nunique() > 1
        if mixed.any():
            model, seed, family = mixed[mixed].index[0]
            return (
                f"family {family!r} at seed {seed} of model {model!r} is marked dropped on "
                "some gates and kept on others (a family is dropped whole)"
            )
    for column, rows in (("ell", None), ("dl_dg", None), ("F", None), ("C", kept)):
        values = frame[column]
        if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
            return f"column {column!r} holds {values.dtype} values, not numbers"
        found = first_unusable(values.to_numpy(dtype=float), rows)
        if found is not None:
            row = frame.iloc[found[0]]
            return f"{column} of {_where(row)} is {found[1]} ({row[column]})"
    if all(c in frame.columns for c in SAMPLE_COLUMNS):
        return _sample_problem(frame if kept is None else frame[kept])
    return None


def _cell_problem(column: str, part: pd.DataFrame) -> str:
    """The first cell of ``column`` that is not a flat, non-empty list of numbers (the
    slow path, taken only for a broken file)."""
    for i, cell in enumerate(part[column]):
        try:
            values = np.asarray(cell, dtype=np.float64)
        except (TypeError, ValueError):
            values = None
        if values is None or values.ndim != 1 or values.size == 0:
            return f"{column} of {_where(part.iloc[i])} is not a list of numbers ({cell!r:.60})"
    return f"column {column!r} holds something other than lists of numbers"


def _sample_problem(frame: pd.DataFrame) -> str | None:
    """``value_problem`` for the per-sample columns of the kept rows that have them."""
    part = frame[frame[SAMPLE_COLUMNS].notna().all(axis=1)]
    if part.empty:
        return None
    counts = {}
    for column in SAMPLE_COLUMNS:
        cells = part[column].to_list()
        try:
            lengths = np.fromiter((len(c) for c in cells), dtype=np.int64, count=len(cells))
            flat = np.concatenate([np.ravel(c) for c in cells]).astype(np.float64)
        except (TypeError, ValueError):
            return _cell_problem(column, part)
        if (lengths == 0).any() or flat.size != lengths.sum():
            return _cell_problem(column, part)
        found = first_unusable(flat)
        if found is not None:
            row = part.iloc[int(np.searchsorted(np.cumsum(lengths), found[0], side="right"))]
            return f"{column} of {_where(row)} has an entry that is {found[1]}"
        counts[column] = lengths
    n = pd.DataFrame(counts, index=part.index)
    family = [part["model"], part["seed"], part["family"]]
    ragged = (n.nunique(axis=1) > 1) | (
        n[SAMPLE_COLUMNS[0]].groupby(family).transform("nunique") > 1
    )
    if ragged.any():
        row = part.loc[ragged.idxmax()]
        return f"the per-sample lists of {_where(row)} differ in length (one entry per sample)"
    return _logp_problem(part) or _unnormalisable_family(part)


def _logp_problem(part: pd.DataFrame) -> str | None:
    """``logp_samples`` are the family's n log-likelihoods (SPEC §2): every entry <= 0, and
    one list shared by every gate row of the family (a row that differs, found by the fuzz
    with [0, 1] on one gate, gave that gate its own l_m and sent NaN into eigh)."""
    shared: dict[tuple, object] = {}
    keys = zip(part["model"], part["seed"], part["family"], strict=True)
    for i, (key, cell) in enumerate(zip(keys, part["logp_samples"], strict=True)):
        if np.max(cell) > 0:
            return f"logp_samples of {_where(part.iloc[i])} has a positive entry (a log-probability is <= 0)"
        if not np.array_equal(shared.setdefault(key, cell), cell):
            return (
                f"logp_samples of {_where(part.iloc[i])} differ between its gates (they are "
                "the family's samples, one list for every gate)"
            )
    return None


def _unnormalisable_family(part: pd.DataFrame) -> str | None:
    """A kept row whose logp samples average to |l_m| < eps0 (SPEC §2 drops such a
    family): its per-sample contributions dlogp / l_m would be infinite."""
    ell = part["logp_samples"].map(np.mean).to_numpy(dtype=np.float64)
    small = np.abs(ell) < EPS0
    if not small.any():
        return None
    at = int(np.argmax(small))
    return (
        f"logp_samples of {_where(part.iloc[at])} average to l_m = {ell[at]:.3g}, "
        f"which cannot normalise C (|l_m| < {EPS0:g}; a measured probe drops such a family): "
        "the file was altered, re-measure it"
    )


def pair_problems(frame: pd.DataFrame) -> dict[tuple, str]:
    """``value_problem`` per (model, seed): the pairs ``--resume`` must not reuse."""
    found = {}
    for (model, seed), group in frame.groupby(["model", "seed"], sort=False):
        problem = value_problem(group)
        if problem is not None:
            found[(model, seed)] = problem
    return found


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
    if len(frame):
        require_families(sorted(set(frame["family"])), what)
    return frame


def require_families(families: list[str], what: str) -> None:
    """Every audit measure compares rows of C (SPEC §3): one line, said once, when
    ``what`` (a probe pool, file or frame) holds fewer than two families."""
    if len(families) < 2:
        count = "one family" if families else "no family"
        raise CdscopeError(
            f"B_shared needs at least 2 families (M >= 2); {what} has {count}"
            + (f" ({families[0]})" if families else "")
            + ": measure a probe with at least 2 task families"
        )
