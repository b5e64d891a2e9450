"""``cdscope probe``: C, F and l_m per (model, seed, family, gate) as long-format Parquet.

For every model and probe seed s = 0..S-1: draw n items per family (SPEC §4), encode
them into one padded batch, run the chosen estimator (SPEC §2) and append one row per
(model, seed, family, gate). The file is rewritten atomically after every finished seed,
so an interrupted run keeps what it finished and ``--resume`` skips it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from cdscope.batch import encode_probe
from cdscope.control import ControlResult, control_autograd, control_finite_difference
from cdscope.distributed import launch_env
from cdscope.errors import CdscopeError
from cdscope.finite import NonFinite
from cdscope.frames import FRAME_COLUMNS, ModelOptions, ProbeSettings, describe_seeds
from cdscope.gates import GatedModel
from cdscope.io import run_metadata, write_parquet
from cdscope.messages import dim, make_console, progress_bar, warn
from cdscope.models import LoadedModel
from cdscope.probes import ProbePool, draw_probe, drawn_ids
from cdscope.resume import resume_mode, reusable_rows


def measure(
    loaded: LoadedModel, gm: GatedModel, pool: ProbePool, seed: int, settings: ProbeSettings
) -> ControlResult:
    """One probe seed on one model: draw, encode, estimate (non-finite values refused)."""
    items = draw_probe(pool, seed, settings.n)
    pad_id = getattr(loaded.tokenizer, "pad_token_id", None) or 0
    batch = encode_probe(items, loaded.tokenizer, settings.template, pad_id=pad_id).to(
        loaded.device
    )
    # CPU default: one row per forward (no padding; measured ~30% faster than one padded
    # batch on the embedded model). GPU default: the whole probe in one batch.
    batch_size = settings.batch_size or (1 if loaded.device.type == "cpu" else None)
    try:
        if settings.estimator == "autograd":
            return control_autograd(gm, batch, batch_size)
        return control_finite_difference(gm, batch, settings.fd_step, batch_size and 8 * batch_size)
    except NonFinite as exc:
        raise exc.at(f"at seed {seed} of model {loaded.name!r}") from None


def dropped_warning(console: Console, spec: str, seed: int, dropped: Sequence[str]) -> None:
    warn(
        console,
        f"{spec} seed {seed}: dropped famil{'y' if len(dropped) == 1 else 'ies'} "
        f"{', '.join(dropped)} (|l_m| < 1e-4 cannot be normalised)",
    )


def record_drawn(metadata: dict, pool: ProbePool, n: int, seeds: Iterable[int]) -> None:
    """Add ``{seed: {family: [item ids]}}`` under ``metadata["drawn"]`` for the finished
    ``seeds`` not recorded yet (each seed's draw is made once per run)."""
    drawn = metadata.setdefault("drawn", {})
    for seed in sorted({int(s) for s in seeds} - {int(k) for k in drawn}):
        drawn[str(seed)] = drawn_ids(draw_probe(pool, seed, n))


def _sample_lists(result: ControlResult) -> dict[str, list]:
    """The per-sample columns (frames.SAMPLE_COLUMNS): one list per (family, gate) row."""
    M, K = result.dl_dg.shape  # noqa: N806
    if result.row_family is None:
        return {}
    rows = [np.flatnonzero(result.row_family == m) for m in range(M)]
    return {  # one tolist per family (K = 10^5..10^6 gates at neuron granularity)
        "logp_samples": [x for r in rows for x in [result.row_logp[r].tolist()] * K],
        "dlogp_samples": [x for r in rows for x in result.row_dlogp[r].T.tolist()],
        "F_samples": [x for r in rows for x in result.row_F[r].T.tolist()],
    }


def result_frame(model: str, seed: int, result: ControlResult) -> pd.DataFrame:
    """Long format: one row per (family, gate), with the per-sample lists when known."""
    M, K = result.dl_dg.shape  # noqa: N806
    gates = result.gate_set
    return pd.DataFrame(
        {
            "model": model,
            "seed": seed,
            "family": np.repeat(result.families, K),
            "gate": np.tile(np.arange(K), M),
            "layer": np.tile(gates.layers, M),
            "sublayer": np.tile(gates.sublayers, M),
            "unit": pd.array(np.tile(np.array(gates.unit_indices, dtype=object), M), dtype="Int64"),
            "C": result.C.ravel(),
            "F": result.F.ravel(),
            "dl_dg": result.dl_dg.ravel(),
            "ell": np.repeat(result.ell, K),
            "dropped": np.repeat(~result.kept, K),
            **_sample_lists(result),
        }
    )


def model_record(loaded: LoadedModel, gm: GatedModel) -> dict:
    return {
        "name": loaded.name,
        "source": loaded.source,
        "revision": loaded.revision,
        "architecture": loaded.model.config.model_type,
        "layers": loaded.num_layers,
        "K": gm.gate_set.K,
        "granularity": gm.gate_set.granularity,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": str(loaded.device),
    }


def probe_metadata(
    command: str, pool: ProbePool, settings: ProbeSettings, options: ModelOptions, world_size: int
) -> dict:
    """Run metadata of a probe measurement (``models`` is filled as models load)."""
    return run_metadata(
        command,
        probe_hash=pool.hash,
        probe_files=list(pool.paths),
        families=pool.families,
        seeds=describe_seeds(settings.seeds),
        settings=settings.comparable(),
        batch_size=settings.batch_size,
        fd_step=settings.fd_step if settings.estimator == "fd" else None,
        fd_order=settings.fd_order if settings.estimator == "fd" else None,
        world_size=world_size,
        placement=options.placement.describe() if options.placement else None,
        models=[],
        drawn={},  # seed -> family -> item ids, for every finished seed
    )


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
) -> tuple[pd.DataFrame, dict]:
    """Measure every (model, seed); write ``out`` (if given) after each; return (frame, metadata).

    A model is a spec for ``load_model`` or an already-loaded ``LoadedModel`` (the
    Python API); rows are labelled with the spec or ``LoadedModel.name``. Under a
    launcher (``WORLD_SIZE`` > 1) the pairs are shared across ranks and rank 0 writes
    ``out`` (``cdscope.commands.parallel``). ``resume``: False, True / 'keep' (reuse
    finished pairs whose model and settings match, refuse otherwise) or 'recompute'
    (measure mismatching pairs again); see ``cdscope.resume``.
    """
    console = console or make_console()
    mode = resume_mode(resume)
    names = [m.name if isinstance(m, LoadedModel) else m for m in model_specs]
    if len(set(names)) != len(names):
        raise CdscopeError(
            "the same --model is given twice (in Python: give each model its own name=)"
        )
    launch = launch_env()
    if launch.active:  # started by torchrun / accelerate launch: (model, seed) pairs across ranks
        from cdscope.commands.parallel import collect_control_parallel

        if out is None or any(isinstance(m, LoadedModel) for m in model_specs):
            raise CdscopeError(
                "under a launcher every model is a spec each rank loads itself, and --out is needed"
            )
        return collect_control_parallel(
            launch, names, pool, settings, out, options, resume, console, command
        )
    metadata = probe_metadata(command, pool, settings, options, world_size=1)
    frames: list[pd.DataFrame] = []
    done: set[tuple[str, int]] = set()
    if mode and out is not None and out.is_file():
        previous, metadata["models"] = reusable_rows(out, metadata, names, options, mode, console)
        frames.append(previous)
        done = set(zip(previous["model"], previous["seed"], strict=True))
        dim(console, f"--resume: keeping {len(done)} finished (model, seed) pair(s) from {out}")

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
            with GatedModel(loaded.model, granularity=settings.granularity) as gm:
                record = model_record(loaded, gm)
                metadata["models"] = [m for m in metadata["models"] if m["name"] != spec] + [record]
                for seed in todo:
                    progress.update(task, description=f"{spec} seed {seed}")
                    result = measure(loaded, gm, pool, seed, settings)
                    if result.dropped:
                        dropped_warning(console, spec, seed, result.dropped)
                    frames.append(result_frame(spec, seed, result))
                    frame = pd.concat(frames, ignore_index=True)
                    record_drawn(metadata, pool, settings.n, frame["seed"])
                    if out is not None:
                        write_parquet(frame, out, metadata)
                    if on_result is not None:
                        on_result(spec, seed, result)
                    progress.advance(task)
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=FRAME_COLUMNS)
    return frame, metadata
