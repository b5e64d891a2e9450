"""``--resume``: which finished rows of an earlier output may be reused.

A finished (model, seed) of ``probe`` / ``bshared`` / ``acg`` / ``decompose`` (or
(model, problem) of ``eval``) is reused only when everything that decides its numbers
is what the new run would use:

- the run: the probe pool's hash and the comparable settings (n, template, estimator
  and its fd step/order; eval: its sampling settings), stored in the output metadata;
- each model: its identity ``model_identity`` — the content hash of its weights and
  config (``models.loading.model_source``: streamed SHA-256, docs/decisions.md) and
  the dtype it computes in. The model *name* alone never counts: changed weights at the
  same path, another ``--dtype`` or another file under the same name are different
  models.

Mode ``keep`` (plain ``--resume``) refuses any mismatch with one line; ``recompute``
(``--resume=recompute``) drops the mismatching rows and measures them again, so the
output never mixes numbers of two different models or settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope.errors import CdscopeError
from cdscope.io import read_parquet
from cdscope.messages import dim
from cdscope.output.frames import ModelOptions

RESUME_MODES = ("keep", "recompute")


def resume_mode(resume: bool | str | None) -> str | None:
    """``False``/``None`` -> None (no resume); ``True`` -> 'keep'; or a mode by name."""
    if resume is None or resume is False:
        return None
    mode = "keep" if resume is True else str(resume)
    if mode not in RESUME_MODES:
        raise CdscopeError(f"--resume takes no value or =recompute; got --resume={mode}")
    return mode


def model_identity(spec: str, options: ModelOptions) -> dict[str, str]:
    """What makes a model compute the same numbers: content hash and dtype."""
    from cdscope.core.models.loading import model_source, resolve_device, resolve_dtype

    _, revision = model_source(
        spec, revision=options.revision, trust_remote_code=options.trust_remote_code
    )
    dtype = resolve_dtype(options.dtype, resolve_device(options.device))
    return {"revision": revision, "dtype": str(dtype).removeprefix("torch.")}


def _describe(identity: dict[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in identity.items())


def reusable_rows(
    out: Path,
    metadata: dict,
    model_specs: Sequence[str],
    options: ModelOptions,
    mode: str,
    console: Console,
) -> tuple[pd.DataFrame, list[dict]]:
    """The earlier rows of ``out`` that this run may keep, and their model records.

    Raises a one-line ``CdscopeError`` on a mismatch in mode ``keep``; drops the
    mismatching rows (all of them when the run settings differ) in mode ``recompute``.
    """
    frame, old = read_parquet(out)
    for key in ("probe_hash", "settings"):
        if old.get(key) != metadata.get(key):
            label = key.replace("_", " ")
            if mode == "keep":
                raise CdscopeError(
                    f"--resume: {out} was made with different {label} "
                    f"({old.get(key)} vs {metadata.get(key)}); use another --out, or "
                    "--resume=recompute to measure everything again"
                )
            dim(console, f"--resume=recompute: {label} changed; measuring everything again")
            return frame.iloc[0:0], []
    if "model" not in frame.columns:
        raise CdscopeError(
            f"--resume: {out} has no model column; it is not an output of this command"
        )
    models = [m for m in old.get("models", []) if isinstance(m, dict)]
    records = {m.get("name"): m for m in models}
    for spec in dict.fromkeys(frame["model"]):
        if spec not in model_specs:
            continue  # not part of this run: kept as it is
        now = model_identity(spec, options)
        before = {key: records.get(spec, {}).get(key) for key in now}
        if before == now:
            continue
        changed = ", ".join(key for key in now if before[key] != now[key])
        if mode == "keep":
            raise CdscopeError(
                f"--resume: {out} holds {spec!r} measured with {_describe(before)} but it is "
                f"now {_describe(now)} ({changed} changed); use another --out, or "
                "--resume=recompute to measure it again"
            )
        dim(console, f"--resume=recompute: {spec} changed ({changed}); measuring it again")
        frame = frame[frame["model"] != spec]
        models = [m for m in models if m.get("name") != spec]
    return frame, models


@dataclass
class ResumeState:
    """What a resumed run starts from: the reusable rows, their model records and the
    finished keys (``(model, seed)`` or ``(model, problem_id)``)."""

    frame: pd.DataFrame | None = None
    models: list[dict] = field(default_factory=list)
    done: set[tuple] = field(default_factory=set)


def resume_state(
    out: Path,
    metadata: dict,
    model_specs: Sequence[str],
    options: ModelOptions,
    resume: bool | str | None,
    console: Console,
    key: str,
) -> ResumeState:
    """The one ``--resume`` entry of every command: nothing when not resuming or ``out``
    does not exist yet, else ``reusable_rows`` keyed by (model, ``key``)."""
    mode = resume_mode(resume)
    if not mode or not out.is_file():
        return ResumeState()
    frame, models = reusable_rows(out, metadata, model_specs, options, mode, console)
    done = set(zip(frame["model"], frame[key], strict=True))
    dim(console, f"--resume: keeping {len(done)} finished (model, {key}) pair(s) from {out}")
    return ResumeState(frame, models, done)
