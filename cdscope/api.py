"""The public Python API (``import cdscope``): the notebook path through the CLI's code.

Every function here calls the same workflow the command line calls (one path, not
two), and every table comes back as a pandas DataFrame in the schema of the Parquet
file the CLI writes::

    model = cdscope.load_model("smollm2-135m")    # or load_model(hf_model, hf_tokenizer)
    frame = cdscope.measure(model, seeds=3)       # C, F, l_m: the `probe` Parquet schema
    audit = cdscope.bshared(frame)                # .per_seed, .summary, .paired
    cdscope.plot(audit, "bshared.png")            # the Figure (a notebook shows it)

Quantities: C, F and l_m (SPEC §2); B_shared, ACG, the decomposition and the random
reference (SPEC §3-4); same-seed paired differences (SPEC §4). A wrong input raises
``CdscopeError`` with one sentence saying what was wrong.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from cdscope.commands.audit import AUDITS, AuditResult, evaluate_audit
from cdscope.commands.audit_inputs import check_probe_frame
from cdscope.commands.random_ref import RandomReferenceResult, random_reference_result
from cdscope.core.models.opening import ModelOptions
from cdscope.core.probes import REQUIRED_KEYS, ProbePool, pool_from_records
from cdscope.core.probes import draw_probe as _draw
from cdscope.core.probes import load_pool as _load_pool_files
from cdscope.errors import CdscopeError
from cdscope.messages import make_console
from cdscope.output.frames import ProbeSettings
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings.names import SUBLAYER

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from cdscope.core.models.loading import LoadedModel

#: what ``probe=`` / ``load_pool`` accept: None (the shipped pools), a pool, JSONL
#: path(s), a list of dicts, or a DataFrame with columns id, family, prompt, target
PoolSource = ProbePool | str | Path | Sequence[Any] | pd.DataFrame | None
ModelLike = Any  # "LoadedModel | str | Path | transformers model"; see load_model


def load_model(
    model: ModelLike = EMBEDDED_NAME,
    tokenizer: Any = None,
    *,
    name: str | None = None,
    device: str = "auto",
    dtype: str = "auto",
    attn: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """A model ready to measure: a hub id, local directory, ``.gguf`` file, the embedded
    ``"smollm2-135m"``, or an already-loaded transformers model with its ``tokenizer``.

    ``device``: auto | cpu | cuda[:N] | mps; ``dtype``: auto | float32 | bfloat16 |
    float16 | float64 (for a model object, ``auto`` keeps its device and dtype).
    ``revision`` pins a hub branch, tag or commit; ``name`` labels the rows.
    """
    from cdscope.core.models.opening import open_model

    options = ModelOptions(
        device, dtype, attn, revision=revision, trust_remote_code=trust_remote_code
    )
    return open_model(model, tokenizer, options=options, name=name)


def load_pool(source: PoolSource = None) -> ProbePool:
    """A probe pool: the shipped math/code/logic pools (``None``), JSONL path(s), a list
    of dicts or a DataFrame with ``id``, ``family``, ``prompt``, ``target`` (strings;
    ``source`` and other keys optional), or a pool (returned as is)."""
    if source is None:
        return _load_pool_files()
    if isinstance(source, ProbePool):
        return source
    if isinstance(source, str | Path):
        return _load_pool_files([source])
    if isinstance(source, pd.DataFrame):
        missing = [c for c in REQUIRED_KEYS if c not in source.columns]
        if missing:
            raise CdscopeError(
                f"the probe frame lacks column(s) {', '.join(missing)}; a probe needs "
                f"{', '.join(REQUIRED_KEYS)} ('target' is the verified-correct answer)"
            )
        records = [
            {k: v for k, v in row.items() if not (isinstance(v, float) and math.isnan(v))}
            for row in source.to_dict(orient="records")
        ]
        return pool_from_records(records, "frame row")
    if isinstance(source, Sequence) and all(isinstance(s, str | Path) for s in source):
        return _load_pool_files(list(source))
    if isinstance(source, Sequence):
        return pool_from_records(list(source), "probe")
    raise CdscopeError(
        "probe must be None (the shipped pools), a JSONL path, a list of dicts or a "
        f"DataFrame, not {type(source).__name__}"
    )


def draw_probe(
    pool: PoolSource = None, seed: int = 0, n: int = 3, families: Sequence[str] | None = None
) -> pd.DataFrame:
    """The ``n`` items per family that probe seed ``seed`` measures (SPEC §4), as a frame
    with columns id, family, prompt, target, source: the same draw for every model."""
    items = _draw(load_pool(pool), seed, n, families)
    columns = ["id", "family", "prompt", "target", "source"]
    return pd.DataFrame([[getattr(it, c) for c in columns] for it in items], columns=columns)


def measure(
    model: ModelLike | Sequence[ModelLike],
    probe: PoolSource = None,
    *,
    seeds: int | Sequence[int] = 1,
    n: int = 3,
    template: str = "plain",
    estimator: str = "autograd",
    batch_size: int | None = None,
    progress: bool = True,
    granularity: str = SUBLAYER,
    probe_split: str = "all",
) -> pd.DataFrame:
    """C, F and l_m of one model or a list of models on probe seeds ``0..seeds-1`` (or the
    given seeds), ``n`` items per family: one row per (model, seed, family, gate), the
    schema of ``cdscope probe``'s Parquet; its metadata is in ``frame.attrs["cdscope"]``.
    ``granularity``: sublayer | head | expert | neuron (docs/granularity.md);
    ``probe_split``: all | train | audit, the half of the pool drawn from (docs/probes.md)."""
    from cdscope.commands.probe import collect_control
    from cdscope.commands.requests import ProbeRun

    given = list(model) if isinstance(model, list | tuple) else [model]
    models = [load_model(m) for m in given]
    if isinstance(seeds, numbers.Integral):
        if seeds < 1:
            raise CdscopeError(f"seeds must be at least 1, got {seeds}")
        seeds = range(seeds)
    settings = ProbeSettings(
        tuple(int(s) for s in seeds), n, template, estimator, batch_size,
        granularity=granularity, probe_split=probe_split,
    )  # fmt: skip
    console = make_console(quiet=not progress)
    frame, metadata = collect_control(ProbeRun(models, load_pool(probe), settings), console)
    frame.attrs["cdscope"] = metadata
    return frame


def _audit(command: str, data: Any, measure_options: dict[str, Any]) -> AuditResult:
    """A probe frame (or a model / list of models, measured first) -> an audit."""
    if isinstance(data, pd.DataFrame):
        if measure_options:
            raise CdscopeError(
                f"{', '.join(measure_options)} apply when measuring a model, not to a frame"
            )
        frame = check_probe_frame(data)
    else:
        frame = measure(data, **measure_options)
    metadata = frame.attrs.get("cdscope", {})
    quiet = make_console(quiet=not measure_options.get("progress", True))
    return evaluate_audit(AUDITS[command], frame, metadata, quiet)


def bshared(data: Any, **measure_options: Any) -> AuditResult:
    """B_shared(C) = lambda_1(C C^T) / tr(C C^T) and R(C) per model and seed (SPEC §3),
    mean ± SE over seeds and paired rows against the first model (SPEC §4).

    ``data``: a probe frame from ``measure``, or model(s) measured here with
    ``measure_options`` (probe=, seeds=, n=, ...)."""
    return _audit("bshared", data, measure_options)


def acg(data: Any, **measure_options: Any) -> AuditResult:
    """ACG = B_shared(F) - B_shared(C) per model and seed (SPEC §3); as ``bshared``."""
    return _audit("acg", data, measure_options)


def decompose(data: Any, **measure_options: Any) -> AuditResult:
    """B_dir, B_norm, pairwise |cos| of C's rows and each family's participation ratio
    (SPEC §3); as ``bshared``."""
    return _audit("decompose", data, measure_options)


def compare(
    data: AuditResult | pd.DataFrame, *, reference: str | None = None, audit: str = "bshared"
) -> pd.DataFrame:
    """Same-seed paired differences of every model against ``reference`` (default: the
    first model): n, mean, SE, negatives and the 95% Student-t interval (SPEC §4).

    ``data``: an audit result, or a probe frame with at least two models (``audit``
    names the measures: bshared | acg | decompose)."""
    if audit not in AUDITS:
        raise CdscopeError(f"audit must be one of {', '.join(AUDITS)}, got {audit!r}")
    result = data if isinstance(data, AuditResult) else _audit(audit, data, {})
    frame = result.probe_frame
    models = list(dict.fromkeys(frame["model"]))
    if len(models) < 2:
        raise CdscopeError(
            "compare needs at least two models in the frame: measure([model_a, model_b])"
        )
    if reference is not None:
        if reference not in models:
            raise CdscopeError(f"reference {reference!r} is not one of {', '.join(models)}")
        first = frame["model"] == reference
        frame = pd.concat([frame[first], frame[~first]], ignore_index=True)
        result = evaluate_audit(
            AUDITS[result.command],
            frame,
            result.metadata.get("probe", {}),
            make_console(quiet=True),
        )
    return result.paired


def random_reference(
    families: int = 3,
    gates: int | None = None,
    *,
    model: ModelLike | None = None,
    trials: int = 50_000,
    seed: int = 0,
    value: float | None = None,
) -> RandomReferenceResult:
    """B_shared of ``trials`` i.i.d. Gaussian M x K matrices (SPEC §4): M = ``families``,
    K = ``gates`` or the gate count of ``model`` (``random_ref.gate_count``, as measured);
    ``value`` (a B_shared fraction) gets its percentile. ``.stats`` holds mean, std, p95,
    p99; ``.frame`` the samples."""
    from cdscope.commands.random_ref import gate_count
    from cdscope.core.models.loading import LoadedModel

    spec = None
    if isinstance(model, LoadedModel):
        gates = gates if gates is not None else gate_count(model.model)
        spec = model.name
    elif model is not None:
        spec = str(model)
    return random_reference_result(families, gates, trials, seed, value, spec)


def plot(
    result: AuditResult | RandomReferenceResult,
    path: str | Path | None = None,
    *,
    ax: Axes | None = None,
) -> Figure:
    """The CLI's ``--plot`` figure of ``result``, as a matplotlib Figure (a notebook shows
    it); written to ``path`` too when given (.png, .pdf or .svg).

    ``ax``: draw the first panel (the bars of an audit, the histogram of a random
    reference) on this Axes of your own figure and return that figure."""
    from cdscope.commands.audit_plot import draw_audit
    from cdscope.commands.random_ref import draw_random_reference
    from cdscope.io import check_plot_path

    target = None if path is None else Path(path)
    if target is not None:
        check_plot_path(target)
    if ax is not None and not hasattr(ax, "get_figure"):
        raise CdscopeError(f"ax must be a matplotlib Axes, not {type(ax).__name__}")
    if isinstance(result, AuditResult):
        return draw_audit(target, result, ax)
    if isinstance(result, RandomReferenceResult):
        return draw_random_reference(target, result, ax)
    raise CdscopeError(
        "plot takes what bshared/acg/decompose/random_reference return, "
        f"not {type(result).__name__}"
    )


def read_results(path: str | Path) -> pd.DataFrame:
    """A Parquet file written by the CLI (or this API) as a DataFrame; its run metadata
    (models with revisions, probe hash, settings) is in ``frame.attrs["cdscope"]``."""
    from cdscope.io import read_parquet

    frame, metadata = read_parquet(path)
    frame.attrs["cdscope"] = metadata
    return frame
