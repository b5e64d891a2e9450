"""What cdscope's outputs look like to other tools: the Arrow type of every Parquet column,
and strict JSON.

**Parquet.** Every column name cdscope writes has one Arrow type, listed once here
(``COLUMNS``; families of names such as ``reward_<family>`` in ``COLUMN_PREFIXES``), and
``io.write_parquet`` writes each column with that type whatever the run holds: a
one-model, one-seed summary, whose paired columns are all missing, types them like a
two-model run does (``double``, ``int64``, ``large_string``, never Arrow ``null``),
and integer counts stay ``int64`` where some rows lack them (an Arrow null, which pandas
reads back as ``<NA>`` of dtype ``Int64``). So the files of many runs scan together with
``pyarrow.dataset`` or polars. A name means the same thing in every file (``n`` is an
integer count wherever it appears, ``seed`` an integer seed); ``tests/cli/test_schemas.py``
checks every output of every command against this table.

**JSON.** ``--json`` output and the run metadata in each Parquet file are strict JSON
(RFC 8259, what ``JSON.parse`` and ``jq`` accept): NaN and ±inf are written as ``null``
(:func:`strict_json`). A ``null`` number means "not defined for this run" -- e.g. the
standard error of a one-seed mean, or a measure a model has no value for.
"""

from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa

from cdscope.settings.names import SUBLAYER

STRING = pa.large_string()  # what pandas >= 3 writes for str columns; polars' native type
INT = pa.int64()
FLOAT = pa.float64()
BOOL = pa.bool_()
FLOATS = pa.list_(pa.float64())  # one value per probe sample

#: every column name cdscope writes, with its Arrow type (grouped by the files they are in)
COLUMNS: dict[str, pa.DataType] = {
    # probe frame (probe, OUT.probe.parquet of the audits and nsweep): docs/probe.md
    "model": STRING, "seed": INT, "family": STRING, "gate": INT, "layer": INT,
    SUBLAYER: STRING, "unit": INT, "C": FLOAT, "F": FLOAT, "dl_dg": FLOAT, "ell": FLOAT,
    "dropped": BOOL, "logp_samples": FLOATS, "dlogp_samples": FLOATS, "F_samples": FLOATS,
    "upstream": STRING, "downstream": STRING, "path": STRING,  # edge granularity
    # bshared / acg / decompose: per seed, OUT.summary (mean and paired rows), OUT.convergence
    "measure": STRING, "family_b": STRING, "value_unit": STRING, "value": FLOAT,
    # boot_*: a bootstrap spread (per-seed audit rows, eap-info), not a confidence interval;
    # ci_*: a Student-t confidence interval (paired rows) -- issue 36, docs/decisions.md
    "boot_low": FLOAT, "boot_high": FLOAT, "ci_low": FLOAT, "ci_high": FLOAT,
    "n_seeds": INT, "mean": FLOAT, "se": FLOAT, "kind": STRING, "reference": STRING,
    "n": INT, "n_negative": INT, "sd": FLOAT,
    # seeds a paired t-test needs for the target Delta ``detect`` (not the observed mean),
    # with the range the SD's chi-square interval allows; inf: out of reach
    "detect": FLOAT, "seeds_needed": FLOAT, "seeds_needed_low": FLOAT, "seeds_needed_high": FLOAT,
    "angle_deg": FLOAT, "dk_bound_deg": FLOAT, "eigengap": FLOAT, "gate_angle_deg": FLOAT,
    # random-ref
    "trial": INT, "B_shared": FLOAT,
    # eap-info: per sample and OUT.edges
    "sample_id": STRING, "answer_source": STRING, "intensity": FLOAT,
    "info_complexity": FLOAT, "kurtosis": FLOAT, "n_tokens": INT, "seq_tokens": INT,
    "loss": FLOAT, "mean_score": FLOAT, "mean_abs_score": FLOAT,
    # gradcheck
    "estimator": STRING, "eps": FLOAT, "is_default": BOOL, "cosine": FLOAT,
    "rel_error": FLOAT, "seconds": FLOAT, "exact_seconds": FLOAT, "R": FLOAT,
    "routing_decisions": INT, "routing_switched": INT, "routing_unheld": INT,  # MoE only
    # eval: samples, passk, contamination (--audit)
    "benchmark": STRING, "domain": STRING, "problem_id": STRING, "sample": INT,
    "completion": STRING, "passed": BOOL, "message": STRING, "generated_tokens": INT,
    "subset": STRING, "level": STRING, "k": INT, "pass_at_k": FLOAT, "problems": INT,
    "against": STRING, "items": INT, "exact": INT, "normalised": INT, "code_items": INT,
    "same_asserts": INT, "max_jaccard": FLOAT, "max_pair": STRING,
    # train: log.parquet (both backends)
    "step": INT, "reward": FLOAT, "verifier_errors": INT, "kl": FLOAT, "grad_norm_rl": FLOAT, "lr": FLOAT,
    "completion_tokens": INT, "skipped_fraction": FLOAT, "b_shared_before": FLOAT,
    "audit_b_shared": FLOAT, "grad_norm_reg": FLOAT, "r_before": FLOAT,
    "b_shared_after_update": FLOAT, "b_shared_after": FLOAT, "r_after": FLOAT,
    "r_regularizer": FLOAT, "proj_iters": INT, "grad_norm_proj": FLOAT, "proj_moved": FLOAT,
    "rollout_s": FLOAT, "backbone_s": FLOAT,
    "measure_s": FLOAT, "regularizer_s": FLOAT, "projection_s": FLOAT, "step_s": FLOAT,
    # train: eval.parquet and audit.parquet (held-out evidence, train/evidence.py)
    "trained": BOOL, "samples": INT, "b_shared": FLOAT, "b_dir": FLOAT, "b_norm": FLOAT,
    "b_shared_unbiased": FLOAT, "gram_negative_mass": FLOAT, "families": STRING,
    "correct": INT,  # eval_problems.parquet: samples of a problem that passed
    # train: completions.parquet (--log-completions, train/completions.py)
    "truncated": BOOL, "advantage": FLOAT,
}  # fmt: skip
#: names made from a prefix: the mean reward per training family, contamination counts per
#: Jaccard threshold (``jaccard>=0.8``)
COLUMN_PREFIXES: dict[str, pa.DataType] = {"reward_": FLOAT, "jaccard>=": INT}


def column_type(name: str) -> pa.DataType | None:
    """The Arrow type of column ``name``, or None for a name cdscope does not write."""
    if name in COLUMNS:
        return COLUMNS[name]
    return next((t for p, t in COLUMN_PREFIXES.items() if name.startswith(p)), None)


def _as_pandas(column: pd.Series, arrow: pa.DataType) -> pd.Series:
    """``column`` in a pandas dtype that converts to ``arrow`` without loss: integers with
    missing values as nullable ``Int64`` (a float column of whole numbers and NaN, or an
    object column of ints and None); missing booleans as ``boolean``."""
    if pa.types.is_integer(arrow) and not pd.api.types.is_integer_dtype(column.dtype):
        return column.astype("Int64")  # refuses non-whole floats: a wrong type is a bug
    if pa.types.is_boolean(arrow) and not pd.api.types.is_bool_dtype(column.dtype):
        return column.astype("boolean")
    return column


def arrow_table(frame: pd.DataFrame) -> pa.Table:
    """``frame`` as an Arrow table whose columns have their ``COLUMNS`` type; a column
    this module does not list keeps the type Arrow infers (tests write such files)."""
    fields, prepared = [], {}
    for name in frame.columns:
        arrow = column_type(str(name))
        column = frame[name]
        if arrow is None:
            arrow = pa.Schema.from_pandas(frame[[name]], preserve_index=False).field(0).type
        else:
            column = _as_pandas(column, arrow)
        fields.append(pa.field(str(name), arrow))
        prepared[name] = column
    data = pd.DataFrame(prepared, index=frame.index)
    return pa.Table.from_pandas(data, schema=pa.schema(fields), preserve_index=False)


def strict_json(value: object) -> object:
    """``value`` with only strict-JSON values left: non-finite floats and missing values
    (NaN, ±inf, ``pd.NA``, ``NaT``) -> None, numpy scalars and arrays -> Python numbers and
    lists, tuples and sets -> lists, dict keys -> strings, anything else (paths, timestamps)
    -> its ``str``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [strict_json(v) for v in value]
    if value is pd.NA or value is pd.NaT:
        return None
    for method in ("tolist", "item"):  # numpy arrays, then numpy / pandas scalars
        if hasattr(value, method):
            return strict_json(getattr(value, method)())
    return str(value)
