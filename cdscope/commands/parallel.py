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
code of ``collect_control`` (``workflow.measure_seed``, ``workflow.result_frame``), on a fresh draw from its
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
from cdscope.commands.requests import ProbeRun
from cdscope.commands.workflow import (
    dropped_warning,
    gated,
    measure_seed,
    model_record,
    probe_metadata,
    record_drawn,
    result_frame,
    routing_note,
)
from cdscope.core.models.opening import ModelOptions
from cdscope.core.probes import ProbePool
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet, partial_path
from cdscope.io import write_parquet
from cdscope.messages import dim
from cdscope.output.frames import FRAME_COLUMNS, ProbeSettings
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
            result = measure_seed(self._loaded, self._gm, self.pool, seed, self.settings)
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
            "routing": result.routing,
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


class _Gathered:
    """Rank 0's view of the run: the rows kept from ``--resume`` and every pair finished
    on any rank, in the single-process order."""

    def __init__(self, state: ResumeState, work: list[tuple[str, int]], names: list[str]):
        self.previous, self.records, self.work, self.names = state.frame, state.models, work, names
        self.finished: dict[tuple[str, int], pd.DataFrame] = {}
        self.new_records: dict[str, dict] = {}

    def add(self, statuses: list, console: Console, metadata: dict) -> bool:
        """Take one round's statuses (routing counts into ``metadata``); whether any pair
        finished."""
        measured = [s for s in statuses if s and "pair" in s]
        for status in measured:
            self.finished[status["pair"]] = status["frame"]
            self.new_records.setdefault(status["pair"][0], status["record"])
            if status["dropped"]:
                dropped_warning(console, *status["pair"], status["dropped"])
            routing_note(console, metadata, *status["pair"], status.get("routing"))
        return bool(measured)

    def frame(self) -> pd.DataFrame:
        parts = [] if self.previous is None else [self.previous]
        parts += [self.finished[p] for p in self.work if p in self.finished]
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=FRAME_COLUMNS)

    def model_records(self) -> list[dict]:
        fresh = [self.new_records[m] for m in self.names if m in self.new_records]
        return [r for r in self.records if r["name"] not in self.new_records] + fresh


def collect_control_parallel(
    launch: distributed.Launch, run: ProbeRun, console: Console, outputs: FileSet
) -> tuple[pd.DataFrame, dict]:
    """``collect_control`` across the launcher's ranks; rank 0 returns (frame, metadata)
    for the caller to write into ``outputs``.

    Ranks > 0 raise ``distributed.WorkerDone`` once their share is gathered.
    """
    options = run.options
    if options.placement is None:  # each rank on its own GPU (a device map spans devices itself)
        run = replace(run, options=replace(options, device=distributed.rank_device(options.device)))
    device_type = "cuda" if run.options.device.startswith("cuda") else "cpu"
    with distributed.process_group(launch, device_type):
        metadata = probe_metadata(
            run.command, run.pool, run.settings, run.options, world_size=launch.world_size
        )
        state = _resume_on_main(
            run.out, metadata, run.resume, launch, run.names, run.options, console, outputs
        )
        work = [(m, s) for m in run.names for s in run.settings.seeds if (m, s) not in state.done]
        if 0 < len(work) < launch.world_size:
            raise CdscopeError(
                f"launched with {launch.world_size} ranks but only {len(work)} (model, seed) pair(s) "
                f"are left to measure; launch at most {len(work)} processes or add --seeds/--model"
            )
        gathered = _Gathered(state, work, run.names)
        _measure_rounds(launch, run, gathered, metadata, console)
        if not launch.is_main:
            raise distributed.WorkerDone
        return gathered.frame(), metadata


def _measure_rounds(
    launch: distributed.Launch,
    run: ProbeRun,
    gathered: _Gathered,
    metadata: dict,
    console: Console,
) -> None:
    """Round r: every rank measures its r-th pair, all statuses reach every rank, rank 0
    rewrites the progress file; a failure anywhere ends every rank with one line."""
    mine = distributed.share(gathered.work, launch)
    rounds = math.ceil(len(gathered.work) / launch.world_size)
    worker = _RankWorker(run.pool, run.settings, run.options, console)
    try:
        for r in range(rounds):
            statuses = distributed.gather_status(
                worker.run(mine[r] if r < len(mine) else None, launch.rank), launch
            )
            errors = [s["error"] for s in statuses if s and "error" in s]
            measured = gathered.add(statuses, console, metadata)
            metadata["models"] = gathered.model_records()
            if launch.is_main and measured:
                frame = gathered.frame()
                record_drawn(metadata, run.pool, run.settings.n, frame["seed"])
                write_parquet(frame, partial_path(run.out), metadata)
                dim(
                    console,
                    f"round {r + 1}/{rounds}: {len(gathered.finished)}/{len(gathered.work)} "
                    f"(model, seed) pair(s) measured on {launch.world_size} ranks",
                )
            if errors:
                if launch.is_main:
                    distributed.exit_on_own_terms()
                distributed.from_main(None, launch)  # the others leave after rank 0 wrote
                more = f" (and {len(errors) - 1} more failing rank(s))" if len(errors) > 1 else ""
                raise CdscopeError(errors[0] + more)
    finally:
        worker.close()
