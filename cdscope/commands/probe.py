"""``cdscope probe``: C, F and l_m per (model, seed, family, gate) as long-format Parquet.

For every model and probe seed s = 0..S-1: draw n items per family (SPEC §4), encode
them into one padded batch, run the chosen estimator (SPEC §2) and append one row per
(model, seed, family, gate). The progress file ``OUT.partial.parquet`` is rewritten
atomically after every finished seed, so an interrupted run keeps what it finished and
``--resume`` skips it; ``OUT`` itself is replaced only when the run is complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
from rich.console import Console

from cdscope.commands.audit_inputs import pair_problems
from cdscope.commands.parallel import collect_control_parallel
from cdscope.commands.requests import ProbeRun
from cdscope.commands.workflow import (
    distinct_models,
    dropped_warning,
    gated,
    measure_seed,
    model_record,
    probe_metadata,
    record_drawn,
    result_frame,
    routing_note,
    training_overlap,
)
from cdscope.core.control import ControlResult
from cdscope.core.models import LoadedModel
from cdscope.core.models.hub import check_model_spec
from cdscope.core.probes import split_pool
from cdscope.distributed import is_main_process, launch_env
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet, partial_path
from cdscope.io import write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.output.frames import FRAME_COLUMNS
from cdscope.output.resume import ResumeState, resume_mode, resume_state


def collect_control(
    run: ProbeRun,
    console: Console | None = None,
    on_result: Callable[[str, int, ControlResult], None] | None = None,
    outputs: FileSet | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Measure every (model, seed) of ``run``; return (frame, metadata); with ``run.out``,
    write it.

    Rows are labelled with each spec or ``LoadedModel.name``. With ``out`` the progress
    after each seed goes to ``partial_path(out)`` and the whole frame to ``out`` as part of
    the output set ``outputs`` (made here when None: ``out`` alone), so a complete earlier
    ``out`` stays as it was until this run's set is complete. Under a launcher
    (``WORLD_SIZE`` > 1) the pairs are shared across ranks and rank 0 writes
    (``cdscope.commands.parallel``). ``on_result(spec, seed, result)`` sees each finished
    measurement (one process only).

    The draws come from ``run.settings.probe_split``'s half of ``run.pool``; a model whose folder
    records a training probe (``core.probes.TRAINING_PROBE_FILE``) that shares items with
    those draws gets a one-line warning (``workflow.training_overlap``).
    """
    console = console or make_console()
    resume_mode(run.resume)  # a wrong mode is refused before anything loads
    distinct_models(run.names)
    run = dataclasses.replace(run, pool=split_pool(run.pool, run.settings.probe_split))
    overlap = {}  # model -> the items of its training probe that this run draws
    if is_main_process():
        overlap = training_overlap(run.models, run.names, run.pool, run.settings, console)
    launch = launch_env()
    loaded = any(isinstance(m, LoadedModel) for m in run.models)
    if launch.active and (run.out is None or loaded):
        raise CdscopeError(
            "under a launcher every model is a spec each rank loads itself, and --out is needed"
        )
    with contextlib.ExitStack() as stack:
        if run.out is not None and outputs is None:
            outputs = stack.enter_context(FileSet(run.out))
        if launch.active:  # started by torchrun / accelerate launch: pairs across ranks
            frame, metadata = collect_control_parallel(launch, run, console, outputs)
        else:
            frame, metadata = _collect(run, console, on_result, outputs)
        metadata["training_probe_overlap"] = overlap  # model -> its training items drawn here
        if run.out is not None and outputs is not None:
            outputs.write_parquet(frame, run.out, metadata)
            outputs.remove_on_commit(partial_path(run.out))
    return frame, metadata


def _resume(run: ProbeRun, metadata: dict, console: Console, outputs: FileSet) -> ResumeState:
    """The finished pairs of ``run.out`` this run may keep (its lock taken first)."""
    outputs.lock()  # before reading what another run may write
    state = resume_state(
        run.out, metadata, run.names, run.options, run.resume, console, "seed",
        bad_pairs=pair_problems, asked=run.settings.seeds,
    )  # fmt: skip
    if state.frame is not None:
        metadata["models"] = state.models
    return state


@dataclass
class _Collected:
    """The rows and metadata of a single-process run so far; each finished (model, seed)
    is added and the progress file rewritten (``--resume`` continues from it)."""

    run: ProbeRun
    metadata: dict
    frames: list[pd.DataFrame]
    console: Console

    def add(self, spec: str, seed: int, result: ControlResult, record: dict) -> None:
        models = [m for m in self.metadata["models"] if m["name"] != spec]
        self.metadata["models"] = [*models, record]
        if result.dropped:
            dropped_warning(self.console, spec, seed, result.dropped)
        routing_note(self.console, self.metadata, spec, seed, result.routing)
        self.frames.append(result_frame(spec, seed, result))
        frame = self.frame()
        record_drawn(self.metadata, self.run.pool, self.run.settings.n, frame["seed"])
        if self.run.out is not None:
            write_parquet(frame, partial_path(self.run.out), self.metadata)

    def frame(self) -> pd.DataFrame:
        if not self.frames:
            return pd.DataFrame(columns=FRAME_COLUMNS)
        return pd.concat(self.frames, ignore_index=True)


def _collect(
    run: ProbeRun,
    console: Console,
    on_result: Callable[[str, int, ControlResult], None] | None,
    outputs: FileSet | None,
) -> tuple[pd.DataFrame, dict]:
    """One process: every (model, seed) in order, progress rewritten after each."""
    metadata = probe_metadata(run.command, run.pool, run.settings, run.options, world_size=1)
    state = ResumeState() if run.out is None else _resume(run, metadata, console, outputs)
    done = state.done if state.frame is not None else set()
    collected = _Collected(run, metadata, [] if state.frame is None else [state.frame], console)
    seeds = run.settings.seeds
    with progress_bar(console) as progress:
        task = progress.add_task("probing", total=len(run.models) * len(seeds), completed=len(done))
        for given, spec in zip(run.models, run.names, strict=True):
            todo = [s for s in seeds if (spec, s) not in done]
            if not todo:
                continue
            if not isinstance(given, LoadedModel):
                check_model_spec(spec)  # the embedded model not installed: one line, first
                progress.phase(task, f"loading {spec}")
            loaded = given if isinstance(given, LoadedModel) else run.options.load(spec, console)
            progress.phase(task, f"{spec}: finding and proving its residual writes")
            with gated(loaded, run.settings) as gm:
                for seed in todo:
                    progress.phase(task, f"{spec} seed {seed}")
                    result = measure_seed(loaded, gm, run.pool, seed, run.settings)
                    collected.add(spec, seed, result, model_record(loaded, result.gate_set))
                    if on_result is not None:
                        on_result(spec, seed, result)
                    progress.advance(task)
    return collected.frame(), metadata
