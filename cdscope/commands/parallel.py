"""Data-parallel probe measurement: the (model, seed) pairs of an audit shared across ranks.

Started by a launcher (``torchrun --nproc_per_node N cdscope bshared ...``), every rank
runs the same command. Rank 0 reads the ``--resume`` state and tells every rank which
(model, seed) pairs are finished; the remaining pairs, in the single-process order
(models outer, seeds inner), are dealt round-robin. Work proceeds in rounds: in round r
every rank measures its r-th pair (or nothing), then all ranks exchange one status
object each (the pair's long-format frame and model record, or an error line). Rank 0
rewrites the progress file ``partial_path(out)`` atomically after every round, so a rank
dying mid-run leaves the last complete Parquet of whole rounds there and ``--resume``
(under any world size: finished work is keyed by (model, seed) in the file) picks up
from it; ``out`` itself is written with the caller's output set once all is measured.
Rank 0 takes the output's lock before reading the ``--resume`` state, and a refusal
(another writer, a mismatch) reaches every rank as one line.

The numbers are those of a single-process run: each pair is measured by exactly the
code of ``collect_control`` (``workflow.measure``, ``workflow.result_frame``), on a fresh draw from its
seed, and rank 0 writes the rows in the single-process order. The metadata adds
``world_size``.

A failure on any rank (a model that does not load, non-finite values, a crash inside
the estimator) is known to all ranks after the round; rank 0 writes what finished and
every rank exits 2 with the same one line naming the rank.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope import distributed
from cdscope.commands.audit_inputs import pair_problems
from cdscope.commands.workflow import (
    dropped_warning,
    gated,
    measure,
    model_record,
    probe_metadata,
    record_drawn,
    result_frame,
)
from cdscope.core.probes import ProbePool
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet, partial_path
from cdscope.io import write_parquet
from cdscope.messages import dim
from cdscope.output.frames import FRAME_COLUMNS, ModelOptions, ProbeSettings
from cdscope.output.resume import ResumeState, resume_state


class _RankWorker:
    """Measures this rank's pairs, keeping the current model loaded across rounds."""

    def __init__(
        self, pool: ProbePool, settings: ProbeSettings, options: ModelOptions, console: Console
    ) -> None:
        self.pool, self.settings, self.options, self.console = pool, settings, options, console
        self._stack = ExitStack()
        self._spec: str | None = None
        self._loaded = self._gm = None
        self.record: dict | None = None

    def _switch(self, spec: str) -> None:
        if spec == self._spec:
            return
        self._stack.close()
        self._spec, self._stack = None, ExitStack()
        self._loaded = self.options.load(spec, self.console)
        self._gm = self._stack.enter_context(gated(self._loaded, self.settings))
        self._spec = spec

    def run(self, pair: tuple[str, int] | None, rank: int) -> dict | None:
        """One round's status: the pair's frame and model record, or its error line."""
        if pair is None:
            return None
        spec, seed = pair
        try:
            self._switch(spec)
            result = measure(self._loaded, self._gm, self.pool, seed, self.settings)
            self.record = model_record(self._loaded, result.gate_set)
        except CdscopeError as exc:
            return {"error": f"rank {rank}: {exc}"}
        except Exception as exc:  # noqa: BLE001 - any crash must reach every rank as one line
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return {"error": f"rank {rank}: {type(exc).__name__} on {spec} seed {seed}: {first}"}
        return {
            "pair": pair,
            "frame": result_frame(spec, seed, result),
            "record": self.record,
            "dropped": result.dropped,
        }

    def close(self) -> None:
        self._stack.close()


def _resume_on_main(
    out: Path,
    metadata: dict,
    resume: bool | str,
    launch: distributed.Launch,
    model_specs: Sequence[str],
    options: ModelOptions,
    console: Console,
    outputs: FileSet,
) -> ResumeState:
    """Rank 0 locks ``outputs`` and reads the finished pairs of ``out`` that this run may
    reuse (``cdscope.output.resume.resume_state``); every rank receives them (or the
    refusal)."""
    state: object = ResumeState()
    if launch.is_main:
        try:
            outputs.lock()
            state = resume_state(
                out, metadata, model_specs, options, resume, console, "seed",
                bad_pairs=pair_problems,
            )  # fmt: skip
        except CdscopeError as exc:
            state = str(exc)
    state = distributed.from_main(state, launch)
    if isinstance(state, str):
        raise CdscopeError(state)
    return state  # type: ignore[return-value]


def collect_control_parallel(
    launch: distributed.Launch,
    model_specs: Sequence[str],
    pool: ProbePool,
    settings: ProbeSettings,
    out: Path,
    options: ModelOptions,
    resume: bool | str,
    console: Console,
    command: str,
    outputs: FileSet,
) -> tuple[pd.DataFrame, dict]:
    """``collect_control`` across the launcher's ranks; rank 0 returns (frame, metadata)
    for the caller to write into ``outputs``.

    Ranks > 0 raise ``distributed.WorkerDone`` once their share is gathered.
    """
    if options.placement is None:  # each rank on its own GPU (a device map spans devices itself)
        options = replace(options, device=distributed.rank_device(options.device))
    with distributed.process_group(launch, "cuda" if options.device.startswith("cuda") else "cpu"):
        metadata = probe_metadata(command, pool, settings, options, world_size=launch.world_size)
        state = _resume_on_main(
            out, metadata, resume, launch, model_specs, options, console, outputs
        )
        previous, records, done = state.frame, state.models, state.done
        work = [(m, s) for m in model_specs for s in settings.seeds if (m, s) not in done]
        if 0 < len(work) < launch.world_size:
            raise CdscopeError(
                f"launched with {launch.world_size} ranks but only {len(work)} (model, seed) pair(s) "
                f"are left to measure; launch at most {len(work)} processes or add --seeds/--model"
            )
        mine = distributed.share(work, launch)
        rounds = math.ceil(len(work) / launch.world_size)
        finished: dict[tuple[str, int], pd.DataFrame] = {}
        new_records: dict[str, dict] = {}

        def frame_now() -> pd.DataFrame:
            parts = ([] if previous is None else [previous]) + [
                finished[p] for p in work if p in finished
            ]
            return (
                pd.concat(parts, ignore_index=True)
                if parts
                else pd.DataFrame(columns=FRAME_COLUMNS)
            )

        def records_now() -> list[dict]:
            fresh = [new_records[m] for m in model_specs if m in new_records]
            return [r for r in records if r["name"] not in new_records] + fresh

        worker = _RankWorker(pool, settings, options, console)
        try:
            for r in range(rounds):
                statuses = distributed.gather_status(
                    worker.run(mine[r] if r < len(mine) else None, launch.rank), launch
                )
                errors = [s["error"] for s in statuses if s and "error" in s]
                for status in statuses:
                    if status and "pair" in status:
                        finished[status["pair"]] = status["frame"]
                        new_records.setdefault(status["pair"][0], status["record"])
                        if status["dropped"]:
                            dropped_warning(console, *status["pair"], status["dropped"])
                metadata["models"] = records_now()
                if launch.is_main and any(s and "pair" in s for s in statuses):
                    frame = frame_now()
                    record_drawn(metadata, pool, settings.n, frame["seed"])
                    write_parquet(frame, partial_path(out), metadata)
                    dim(
                        console,
                        f"round {r + 1}/{rounds}: {len(finished)}/{len(work)} (model, seed) "
                        f"pair(s) measured on {launch.world_size} ranks",
                    )
                if errors:
                    if launch.is_main:
                        distributed.exit_on_own_terms()
                    distributed.from_main(None, launch)  # the others leave after rank 0 wrote
                    more = (
                        f" (and {len(errors) - 1} more failing rank(s))" if len(errors) > 1 else ""
                    )
                    raise CdscopeError(errors[0] + more)
        finally:
            worker.close()
        if not launch.is_main:
            raise distributed.WorkerDone
        return frame_now(), metadata
