"""What every measuring command shares: one (model, seed) probe measurement, its rows,
the model record and the run metadata of a probe measurement.

``commands/probe.py`` (one process) and ``commands/parallel.py`` (ranks under a
launcher) measure each (model, seed) pair with exactly these functions, so both write
the same numbers; ``eval``, ``eap-info``, ``gradcheck`` and ``train`` describe their
models with ``model_record``. ``--resume`` is ``cdscope.output.resume``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from cdscope.core.batch import encode_probe, rows_per_forward
from cdscope.core.control import ControlResult
from cdscope.core.gates.vocabulary import GateSet
from cdscope.core.granularities import Gates, gates_for
from cdscope.core.models import LoadedModel
from cdscope.core.models.loading import experts_in_use
from cdscope.core.models.opening import ModelOptions
from cdscope.core.probes import (
    ProbePool,
    draw_probe,
    drawn_ids,
    item_overlap,
    read_training_probe,
)
from cdscope.core.routing import RoutingCount
from cdscope.errors import CdscopeError
from cdscope.finite import NonFinite
from cdscope.io import run_metadata
from cdscope.messages import warn
from cdscope.output.frames import ProbeSettings, describe_seeds
from cdscope.settings.names import SUBLAYER


def distinct_models(names: Sequence[str]) -> None:
    """Refuse a model given twice: the same name, or two spellings of one local path
    (``models/base`` and ``./models/base``), which would be paired with itself."""
    seen: dict[str, str] = {}
    for name in names:
        path = Path(name).expanduser()
        key = str(path.resolve()) if path.exists() else name
        if key in seen:
            raise CdscopeError(
                f"the same model is given twice ({seen[key]!r} and {name!r}): give each model "
                "once (in Python: give each model its own name=)"
            )
        seen[key] = name


def gated(loaded: LoadedModel, settings: ProbeSettings) -> Gates:
    """The gates a probe at ``settings.granularity`` measures through
    (``cdscope.core.granularities``; enter them around the measurements)."""
    return gates_for(loaded.model, settings.granularity)


def measure_seed(
    loaded: LoadedModel,
    gates: Gates,
    pool: ProbePool,
    seed: int,
    settings: ProbeSettings,
) -> ControlResult:
    """One probe seed on one model: draw, encode, estimate through ``gates`` (entered, from
    ``gated``); non-finite values refused."""
    items = draw_probe(pool, seed, settings.n)
    pad_id = getattr(loaded.tokenizer, "pad_token_id", None) or 0
    batch = encode_probe(items, loaded.tokenizer, settings.template, pad_id=pad_id).to(
        loaded.device
    )
    # CPU default: one row per forward (no padding; measured ~30% faster than one padded
    # batch on the embedded model). GPU default: the whole probe in one batch.
    batch_size = rows_per_forward(settings.batch_size, loaded.device)
    try:
        return gates.control(batch, settings, batch_size)
    except NonFinite as exc:
        raise exc.at(f"at seed {seed} of model {loaded.name!r}") from None


def training_overlap(
    models: Sequence[str | LoadedModel],
    names: Sequence[str],
    pool: ProbePool,
    settings: ProbeSettings,
    console: Console,
) -> dict[str, list[str]]:
    """``{model name: shared item ids}`` for every model whose folder records the probe it
    was trained on (``core.probes.read_training_probe``) and whose training items this
    run's draws (``settings.seeds`` x ``settings.n`` from ``pool``) include; each such model
    gets one warning line. An audit on items the regulariser fitted measures the fit, not
    the model (docs/probes.md)."""
    drawn = [i.id for s in settings.seeds for i in draw_probe(pool, s, settings.n)]
    found: dict[str, list[str]] = {}
    for model, name in zip(models, names, strict=True):
        source = model.source if isinstance(model, LoadedModel) else model
        record = read_training_probe(source) if Path(str(source)).is_dir() else None
        shared = item_overlap(drawn, record["training_probe_items"] if record else [])
        if record and shared:
            found[name] = shared
            more = ", ..." if len(shared) > 3 else ""
            warn(
                console,
                f"{name} was trained (--regularizer {record.get('regularizer', '?')}) on a probe "
                f"that shares {len(shared)} item(s) with this run's draws ({', '.join(shared[:3])}"
                f"{more}): B_shared there can be the regulariser's fit; use --probe-split audit",
            )
    return found


def dropped_warning(console: Console, spec: str, seed: int, dropped: Sequence[str]) -> None:
    warn(
        console,
        f"{spec} seed {seed}: dropped famil{'y' if len(dropped) == 1 else 'ies'} "
        f"{', '.join(dropped)} (|l_m| < 1e-4 cannot be normalised)",
    )


def routing_note(
    console: Console, metadata: dict, spec: str, seed: int, routing: RoutingCount | None
) -> None:
    """fd on an MoE model: the routing decisions its perturbed forwards held
    (``cdscope.core.routing``) go into ``metadata["fd_routing"][model][seed]``, and a note
    says how many the steps would have switched."""
    if routing is None:
        return
    record = {
        "decisions": routing.decisions,
        "switched": routing.switched,
        "unheld": routing.unheld,
    }
    metadata.setdefault("fd_routing", {}).setdefault(spec, {})[str(seed)] = record
    if routing.switched:
        warn(console, f"{spec} seed {seed}: fd steps: {routing.describe()}", "note:")


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
    """Long format: one row per (family, gate), with the per-sample lists when known; at
    edge granularity also each edge's ``upstream``, ``downstream`` node and ``path``."""
    M, K = result.dl_dg.shape  # noqa: N806
    gates = result.gate_set
    extra = {column: np.tile(values, M) for column, values in gates.frame_columns.items()}
    return pd.DataFrame(
        {
            "model": model,
            "seed": seed,
            "family": np.repeat(result.families, K),
            "gate": np.tile(np.arange(K), M),
            "layer": np.tile(gates.layers, M),
            SUBLAYER: np.tile(gates.sublayers, M),
            "unit": pd.array(np.tile(np.array(gates.unit_indices, dtype=object), M), dtype="Int64"),
            "C": result.C.ravel(),
            "F": result.F.ravel(),
            "dl_dg": result.dl_dg.ravel(),
            "ell": np.repeat(result.ell, K),
            "dropped": np.repeat(~result.kept, K),
            **_sample_lists(result),
            **extra,
        }
    )


def model_record(loaded: LoadedModel, gate_set: GateSet | None = None) -> dict:
    """The one description of a model in every command's run metadata (``models`` /
    ``model``): name as given, resolved source, content revision (what ``--resume``
    compares, ``cdscope.output.resume.model_identity``), architecture type, dtype, device,
    attention kernel and MoE experts kernel actually in use (None without experts); with the gate set it was measured at, also the layer count,
    K and the gate granularity."""
    config = getattr(loaded.model, "config", None)
    gates = {}
    if gate_set is not None:
        gates = {
            "layers": loaded.num_layers,
            "K": gate_set.K,
            "granularity": gate_set.granularity,
        }
    return {
        "name": loaded.name,
        "source": loaded.source,
        "revision": loaded.revision,
        "architecture": getattr(config, "model_type", None),
        **gates,
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "device": str(loaded.device),
        "attn": getattr(config, "_attn_implementation", None),
        "experts": experts_in_use(loaded.model),
    }


def load_record(options: ModelOptions) -> dict:
    """The load options ``--resume`` compares beside each model's identity: the attention
    kernel as asked for (``auto`` resolves per model; the resolved one is in each record)."""
    return {"attn": options.attn}


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
        load=load_record(options),
        placement=options.placement.describe() if options.placement else None,
        models=[],
        drawn={},  # seed -> family -> item ids, for every finished seed
    )
