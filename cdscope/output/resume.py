"""``--resume``: which finished rows of an earlier output may be reused (docs/resume.md).

A finished (model, seed) of ``probe`` / ``bshared`` / ``acg`` / ``decompose`` / ``nsweep``
(or (model, problem) of ``eval``) is reused only when everything that decides its
numbers is what the new run would use. Refused on a mismatch (plain ``--resume``) or
measured again (``--resume=recompute``, which drops exactly the mismatching rows):

- the run: the probe pool's content hash, the comparable settings (n, template,
  estimator and its fd step/order, granularity; eval: its sampling settings) and the
  requested attention kernel (``load``);
- each model (``model_identity``): the content hash of every file that decides its
  numbers (weights, config, tokenizer, chat template, generation config;
  ``core.models.loading.model_source``), the dtype it computes in and the device type
  (a served model of ``eval --endpoint``: its stated identity, the caller's ``identity``).
  The name and the resolved path are metadata, not identity: the same content given as
  ``models/base`` and ``./models/base`` is one model (its rows are kept under the new
  name), other content under the same name is another model;
- eval: each problem's content hash (prompt, answer, tests, ...): an edited task is
  sampled again, the others are kept;
- the rows themselves: values cdscope cannot have written (NaN, strings, ragged
  per-sample lists; the caller's ``bad_pairs``) are never reused.

Library versions (cdscope, torch, transformers, numpy) and the thread count are
compared and warned about, not refused: they move numbers in the last digits only.

An interrupted run keeps its progress in ``OUT.partial`` (``fileset.partial_path``)
while the complete earlier ``OUT`` stays untouched; ``--resume`` continues from the
partial file when there is one, else from ``OUT``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope.core.models.opening import ModelOptions
from cdscope.errors import CdscopeError
from cdscope.fileset import partial_path
from cdscope.io import read_parquet
from cdscope.messages import dim, warn

RESUME_MODES = ("keep", "recompute")
#: run metadata that decides every number: (key, what the message calls it)
RUN_KEYS = (
    ("probe_hash", "probe content"), ("settings", "settings"),
    ("load", "attention kernel (--attn)"),
)  # fmt: skip
#: recorded and warned about: the numbers agree to round-off, not bit for bit
ENVIRONMENT_KEYS = (
    ("threads", "thread count"), ("cdscope_version", "cdscope"), ("torch_version", "torch"),
    ("transformers_version", "transformers"), ("numpy_version", "numpy"),
)  # fmt: skip
#: rows cdscope cannot have written: {(model, key value): why}, from the caller
BadPairs = Callable[[pd.DataFrame], dict[tuple, str]]
#: a model's identity now, by spec, where it is no local model's (eval --endpoint: the
#: served model's stated identity, ``commands.engines.Server.identity``)
Identity = Callable[[str], dict]


def resume_mode(resume: bool | str | None) -> str | None:
    """``False``/``None`` -> None (no resume); ``True`` -> 'keep'; or a mode by name."""
    if resume is None or resume is False:
        return None
    mode = "keep" if resume is True else str(resume)
    if mode not in RESUME_MODES:
        raise CdscopeError(f"--resume takes no value or =recompute; got --resume={mode}")
    return mode


def _device_type(options: ModelOptions) -> str:
    from cdscope.core.models.loading import resolve_device

    if options.placement is not None:
        return "cuda" if options.placement.may_use_cuda else "cpu"
    return resolve_device(options.device).type


def model_identity(spec: str, options: ModelOptions) -> dict[str, str]:
    """What makes a model compute the same numbers: content hash, dtype, device type."""
    import torch

    from cdscope.core.models.loading import model_source, resolve_dtype

    _, revision = model_source(
        spec, revision=options.revision, trust_remote_code=options.trust_remote_code
    )
    device = _device_type(options)
    dtype = resolve_dtype(options.dtype, torch.device(device))
    return {"revision": revision, "dtype": str(dtype).removeprefix("torch."), "device": device}


def recorded_identity(record: dict) -> dict[str, object]:
    """``model_identity`` as a model record of an output holds it (``workflow.model_record``)."""
    device = record.get("device")
    return {
        "revision": record.get("revision"),
        "dtype": record.get("dtype"),
        "device": str(device).split(":")[0] if device else None,
    }


def _describe(identity: dict[str, object]) -> str:
    return ", ".join(f"{k} {v}" for k, v in identity.items())


def environment_changes(old: dict, new: dict) -> list[str]:
    """'thread count 2 -> 1', 'torch 2.12.0 -> 2.13.0', ... for every recorded difference."""
    return [
        f"{label} {old[key]} -> {new[key]}"
        for key, label in ENVIRONMENT_KEYS
        if old.get(key) is not None and new.get(key) is not None and old[key] != new[key]
    ]


@dataclass
class ResumeState:
    """What a resumed run starts from: the reusable rows, their model records, the
    finished keys (``(model, seed)`` or ``(model, problem_id)``), the file they came from
    and its metadata."""

    frame: pd.DataFrame | None = None
    models: list[dict] = field(default_factory=list)
    done: set[tuple] = field(default_factory=set)
    source: Path | None = None
    metadata: dict = field(default_factory=dict)


class _Resume:
    """One ``--resume`` check of ``source`` against the run described by ``metadata``."""

    def __init__(
        self, source: Path, metadata: dict, specs: Sequence[str], options: ModelOptions,
        mode: str, console: Console, key: str, identity: Identity | None = None,
    ) -> None:  # fmt: skip
        self.source, self.metadata, self.specs, self.options = source, metadata, specs, options
        self.mode, self.console, self.key = mode, console, key
        self.identity = identity or (lambda spec: model_identity(spec, self.options))

    def refuse_or_note(self, problem: str, redo: str) -> None:
        """Mode keep: one line naming ``problem`` and how to ``redo`` it; recompute: a note
        that it is redone."""
        if self.mode == "keep":
            raise CdscopeError(
                f"--resume: {self.source} {problem}; use another --out, or --resume=recompute "
                f"to {redo}"
            )
        dim(self.console, f"--resume=recompute: {self.source} {problem}; redoing: {redo}")

    def run_matches(self, old: dict) -> bool:
        for key, label in RUN_KEYS:
            before, now = old.get(key), self.metadata.get(key)
            if key == "load" and before is None:  # written before load options were recorded
                continue
            if before != now:
                self.refuse_or_note(
                    f"was made with different {label} ({before} vs {now})",
                    "measure everything again",
                )
                return False
        changes = environment_changes(old, self.metadata)
        if changes:
            warn(
                self.console,
                f"--resume: {self.source} was measured with other libraries or threads "
                f"({', '.join(changes)}): rows measured now agree with it to round-off, not bit "
                "for bit (docs/resume.md)",
            )
        return True

    def relabel(self, frame: pd.DataFrame, models: list[dict]) -> pd.DataFrame:
        """Rows of a model given now under another name (``./m`` for ``m``) with the same
        identity are kept under the new name: the path is metadata, the content identity."""
        present = list(dict.fromkeys(frame["model"]))
        orphans = [name for name in present if name not in self.specs]
        fresh = [spec for spec in self.specs if spec not in present]
        records = {m.get("name"): m for m in models}
        for spec in fresh:
            if not orphans:
                break
            now = self.identity(spec)
            same = [n for n in orphans if recorded_identity(records.get(n, {})) == now]
            if same:
                frame = frame.assign(model=frame["model"].replace(same[0], spec))
                records[same[0]]["name"] = spec
                orphans.remove(same[0])
                dim(self.console, f"--resume: {same[0]!r} in {self.source} is {spec!r} "
                                  f"(same content, {now['revision']}): kept under the new name")  # fmt: skip
        return frame

    def models_match(self, frame: pd.DataFrame, models: list[dict]) -> tuple[pd.DataFrame, list]:
        records = {m.get("name"): m for m in models}
        for spec in dict.fromkeys(frame["model"]):
            if spec not in self.specs:
                continue  # not part of this run: kept as it is
            now = self.identity(spec)
            before = recorded_identity(records.get(spec, {}))
            if before == now:
                continue
            changed = ", ".join(k for k in now if before[k] != now[k])
            self.refuse_or_note(
                f"holds {spec!r} measured with {_describe(before)} but it is now "
                f"{_describe(now)} ({changed} changed)", "measure it again"
            )  # fmt: skip
            frame = frame[frame["model"] != spec]
            models = [m for m in models if m.get("name") != spec]
        return frame, models

    def items_match(self, frame: pd.DataFrame, old: dict, hashes: dict[str, str]) -> pd.DataFrame:
        """eval: drop (or refuse) the problems whose content changed since they were sampled."""
        stored = old.get("task_hashes")
        done = dict.fromkeys(frame[self.key])
        changed = [i for i in done if i in hashes and (stored or {}).get(i) != hashes[i]]
        if changed:
            why = "" if isinstance(stored, dict) else " (the file records no task contents)"
            self.refuse_or_note(
                f"holds {len(changed)} task(s) whose prompt, answer or tests changed since they "
                f"were sampled (first: {changed[0]!r}){why}", "sample them again"
            )  # fmt: skip
            frame = frame[~frame[self.key].isin(changed)]
        return frame

    def rows_sound(self, frame: pd.DataFrame, bad_pairs: BadPairs) -> pd.DataFrame:
        bad = bad_pairs(frame) if len(frame) else {}
        if bad:
            (model, value), why = next(iter(bad.items()))
            self.refuse_or_note(
                f"holds values cdscope cannot have written ({why}; {len(bad)} (model, "
                f"{self.key}) pair(s))", f"measure {'them' if len(bad) > 1 else 'it'} again"
            )  # fmt: skip
            pairs = pd.Series(
                list(zip(frame["model"], frame[self.key], strict=True)), index=frame.index
            )
            frame = frame[~pairs.isin(list(bad))]
        return frame


def reusable_rows(
    source: Path,
    metadata: dict,
    model_specs: Sequence[str],
    options: ModelOptions,
    mode: str,
    console: Console,
    key: str = "seed",
    item_hashes: dict[str, str] | None = None,
    bad_pairs: BadPairs | None = None,
    identity: Identity | None = None,
) -> tuple[pd.DataFrame, list[dict], dict]:
    """The earlier rows of ``source`` that this run may keep, their model records and the
    file's metadata. Raises a one-line ``CdscopeError`` on a mismatch in mode ``keep``;
    drops the mismatching rows (all of them when the run differs) in mode ``recompute``."""
    frame, old = read_parquet(source)
    check = _Resume(source, metadata, model_specs, options, mode, console, key, identity)
    if not check.run_matches(old):
        return frame.iloc[0:0], [], old
    if "model" not in frame.columns or key not in frame.columns:
        raise CdscopeError(
            f"--resume: {source} has no model/{key} columns; it is not an output of this command"
        )
    models = [dict(m) for m in old.get("models", []) if isinstance(m, dict)]
    frame = check.relabel(frame, models)
    frame, models = check.models_match(frame, models)
    if item_hashes is not None:
        frame = check.items_match(frame, old, item_hashes)
    if bad_pairs is not None:
        frame = check.rows_sound(frame, bad_pairs)
    kept = set(frame["model"])
    return frame, [m for m in models if m.get("name") in kept], old


def resume_state(
    out: Path,
    metadata: dict,
    model_specs: Sequence[str],
    options: ModelOptions,
    resume: bool | str | None,
    console: Console,
    key: str,
    *,
    item_hashes: dict[str, str] | None = None,
    bad_pairs: BadPairs | None = None,
    identity: Identity | None = None,
) -> ResumeState:
    """The one ``--resume`` entry of every command: nothing when not resuming or there is
    no earlier output, else ``reusable_rows`` of the interrupted run's progress file
    (``partial_path(out)``) if there is one, else of ``out``, keyed by (model, ``key``)."""
    mode = resume_mode(resume)
    partial = partial_path(out)
    source = partial if partial.is_file() else out
    if not mode or not source.is_file():
        return ResumeState()
    frame, models, old = reusable_rows(
        source,
        metadata,
        model_specs,
        options,
        mode,
        console,
        key,
        item_hashes,
        bad_pairs,
        identity,
    )
    done = set(zip(frame["model"], frame[key], strict=True))
    dim(console, f"--resume: keeping {len(done)} finished (model, {key}) pair(s) from {source}")
    return ResumeState(frame, models, done, source, old)
