"""``cdscope probe``: C, F and l_m per (model, seed, family, gate) as long-format Parquet.

For every model and probe seed s = 0..S-1: draw n items per family (SPEC §4), encode
them into one padded batch, run the chosen estimator (SPEC §2) and append one row per
(model, seed, family, gate). The progress file ``OUT.partial.parquet`` is rewritten
atomically after every finished seed, so an interrupted run keeps what it finished and
``--resume`` skips it; ``OUT`` itself is replaced only when the run is complete.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd
from rich.console import Console

from cdscope.commands.audit_inputs import pair_problems
from cdscope.commands.parallel import collect_control_parallel
from cdscope.commands.workflow import (
    distinct_models,
    dropped_warning,
    gated,
    measure,
    model_record,
    probe_metadata,
    record_drawn,
    result_frame,
)
from cdscope.core.control import ControlResult
from cdscope.core.models import LoadedModel
from cdscope.core.probes import ProbePool
from cdscope.distributed import launch_env
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet, partial_path
from cdscope.io import write_parquet
from cdscope.messages import make_console, progress_bar
from cdscope.output.frames import FRAME_COLUMNS, ModelOptions, ProbeSettings
from cdscope.output.resume import resume_mode, resume_state


def collect_control(
    model_specs: Sequence[str | LoadedModel],
    pool: ProbePool,
    settings: ProbeSettings,
    out: Path | None,
    options: ModelOptions = ModelOptions(),
    resume: bool | str = False,
    console: Console | None = None,
    command: str = "probe",
    on_result: Callable[[str, int, ControlResult], None] | None = None,
    outputs: FileSet | None = None,
) -> tuple[pd.DataFrame, dict]:
    """Measure every (model, seed); return (frame, metadata); with ``out``, write it.

    A model is a spec for ``load_model`` or an already-loaded ``LoadedModel`` (the
    Python API); rows are labelled with the spec or ``LoadedModel.name``. With ``out``
    the progress after each seed goes to ``partial_path(out)`` and the whole frame to
    ``out`` as part of the output set ``outputs`` (made here when None: ``out`` alone),
    so a complete earlier ``out`` stays as it was until this run's set is complete. Under
    a launcher (``WORLD_SIZE`` > 1) the pairs are shared across ranks and rank 0 writes
    (``cdscope.commands.parallel``). ``resume``: False, True / 'keep' (reuse finished
    pairs whose model and settings match, refuse otherwise) or 'recompute' (measure
    mismatching pairs again); see ``cdscope.output.resume``.
    """
    console = console or make_console()
    resume_mode(resume)  # a wrong mode is refused before anything loads
    names = [m.name if isinstance(m, LoadedModel) else m for m in model_specs]
    distinct_models(names)
    launch = launch_env()
    if launch.active and (out is None or any(isinstance(m, LoadedModel) for m in model_specs)):
        raise CdscopeError(
            "under a launcher every model is a spec each rank loads itself, and --out is needed"
        )
    with contextlib.ExitStack() as stack:
        if out is not None and outputs is None:
            outputs = stack.enter_context(FileSet(out))
        if launch.active:  # started by torchrun / accelerate launch: pairs across ranks
            frame, metadata = collect_control_parallel(
                launch, names, pool, settings, out, options, resume, console, command, outputs
            )
        else:
            frame, metadata = _collect(
                model_specs, names, pool, settings, out, options, resume, console, command,
                on_result, outputs,
            )  # fmt: skip
        if out is not None and outputs is not None:
            outputs.write_parquet(frame, out, metadata)
            outputs.remove_on_commit(partial_path(out))
    return frame, metadata


def _collect(
    model_specs: Sequence[str | LoadedModel],
    names: list[str],
    pool: ProbePool,
    settings: ProbeSettings,
    out: Path | None,
    options: ModelOptions,
    resume: bool | str,
    console: Console,
    command: str,
    on_result: Callable[[str, int, ControlResult], None] | None,
    outputs: FileSet | None,
) -> tuple[pd.DataFrame, dict]:
    """One process: every (model, seed) in order, progress rewritten after each."""
    metadata = probe_metadata(command, pool, settings, options, world_size=1)
    frames: list[pd.DataFrame] = []
    done: set[tuple] = set()
    if out is not None:
        outputs.lock()  # type: ignore[union-attr] - before reading what another run may write
        state = resume_state(
            out, metadata, names, options, resume, console, "seed", bad_pairs=pair_problems
        )
        if state.frame is not None:
            frames.append(state.frame)
            metadata["models"], done = state.models, state.done

    with progress_bar(console) as progress:
        task = progress.add_task(
            "probing", total=len(model_specs) * len(settings.seeds), completed=len(done)
        )
        for given, spec in zip(model_specs, names, strict=True):
            todo = [s for s in settings.seeds if (spec, s) not in done]
            if not todo:
                continue
            progress.update(task, description=f"loading {spec}")
            loaded = given if isinstance(given, LoadedModel) else options.load(spec, console)
            with gated(loaded, settings) as gm:
                for seed in todo:
                    progress.update(task, description=f"{spec} seed {seed}")
                    result = measure(loaded, gm, pool, seed, settings)
                    record = model_record(loaded, result.gate_set)
                    metadata["models"] = [m for m in metadata["models"] if m["name"] != spec] + [
                        record
                    ]
                    if result.dropped:
                        dropped_warning(console, spec, seed, result.dropped)
                    frames.append(result_frame(spec, seed, result))
                    frame = pd.concat(frames, ignore_index=True)
                    record_drawn(metadata, pool, settings.n, frame["seed"])
                    if out is not None:
                        write_parquet(frame, partial_path(out), metadata)
                    if on_result is not None:
                        on_result(spec, seed, result)
                    progress.advance(task)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=FRAME_COLUMNS)
    return frame, metadata
