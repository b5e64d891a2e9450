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
``CdscopeError`` with one sentence saying what was wrong, in the API's words: its argument
names (never a command-line flag: ``errors.python_api``) and its units (fractions).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Iterable, Sequence
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
from cdscope.errors import CdscopeError, python_api
from cdscope.messages import make_console
from cdscope.output.frames import ProbeSettings
from cdscope.resources import EMBEDDED_NAME
from cdscope.settings.measuring import MAX_FAMILIES, MAX_GATES, MAX_TRIALS
from cdscope.settings.names import COUNT_MAX, SEED_MAX, SUBLAYER

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from cdscope.core.models.loading import LoadedModel

#: what ``probe=`` / ``load_pool`` accept: None (the shipped pools), a pool, JSONL
#: path(s), a list of dicts, or a DataFrame with columns id, family, prompt, target
PoolSource = ProbePool | str | Path | Sequence[Any] | pd.DataFrame | None
ModelLike = Any  # "LoadedModel | str | Path | transformers model"; see load_model


def _api(func: Callable) -> Callable:
    """A public function whose errors name its arguments, not command-line flags."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with python_api():
            return func(*args, **kwargs)

    return wrapper


def _whole(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int in [low, high], or one line naming ``name`` and what it got
    (a bool, a float such as 2.5 or 2.0 and a string are no whole numbers here)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise CdscopeError(f"{name} must be a whole number, not {type(value).__name__} {value!r}")
    if not low <= value <= high:
        raise CdscopeError(f"{name} must lie in [{low}, {high:,}]; got {value}")
    return int(value)


def _seeds(seeds: object) -> tuple[int, ...]:
    """``seeds``: a count S >= 1 (probe seeds 0..S-1) or a sequence of distinct seeds. A
    string is refused, never read character by character ('12' is not seeds 1 and 2)."""
    if isinstance(seeds, str | bytes) or not isinstance(seeds, numbers.Integral | Iterable):
        raise CdscopeError(
            "seeds is a count (seeds=3 measures probe seeds 0, 1, 2) or a list of seeds "
            f"(seeds=[4, 7]), not {type(seeds).__name__} {seeds!r}"
        )
    if isinstance(seeds, numbers.Integral):
        return tuple(range(_whole("seeds", seeds, 1, COUNT_MAX)))
    given = [_whole("each seed", s, 0, SEED_MAX) for s in seeds]  # type: ignore[union-attr]
    if not given:
        raise CdscopeError("seeds is an empty list; give at least one seed (or a count)")
    twice = sorted({s for s in given if given.count(s) > 1})
    if twice:
        raise CdscopeError(f"seeds lists seed {twice[0]} more than once")
    return tuple(given)


@_api
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
    from cdscope.core.models.opening import library_bars_off, open_model

    options = ModelOptions(
        device, dtype, attn, revision=revision, trust_remote_code=trust_remote_code
    )
    with library_bars_off():  # as quiet as the CLI
        return open_model(model, tokenizer, options=options, name=name)


@_api
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


@_api
def draw_probe(
    pool: PoolSource = None, seed: int = 0, n: int = 3, families: Sequence[str] | None = None
) -> pd.DataFrame:
    """The ``n`` items per family that probe seed ``seed`` measures (SPEC §4), as a frame
    with columns id, family, prompt, target, source: the same draw for every model."""
    items = _draw(
        load_pool(pool), _whole("seed", seed, 0, SEED_MAX), _whole("n", n, 1, COUNT_MAX), families
    )
    columns = ["id", "family", "prompt", "target", "source"]
    return pd.DataFrame([[getattr(it, c) for c in columns] for it in items], columns=columns)


@_api
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

    chosen = _seeds(seeds)  # every argument checked before any model loads
    n = _whole("n", n, 1, COUNT_MAX)
    if batch_size is not None:
        batch_size = _whole("batch_size", batch_size, 1, COUNT_MAX)
    if not isinstance(progress, bool):
        raise CdscopeError(f"progress must be True or False, not {progress!r}")
    settings = ProbeSettings(
        chosen, n, template, estimator, batch_size,
        granularity=granularity, probe_split=probe_split,
    )  # fmt: skip
    given = list(model) if isinstance(model, list | tuple) else [model]
    models = [load_model(m) for m in given]
    console = make_console(quiet=not progress)
    frame, metadata = collect_control(ProbeRun(models, load_pool(probe), settings), console)
    frame.attrs["cdscope"] = metadata
    return frame


#: the keyword arguments ``bshared`` / ``acg`` / ``decompose`` pass on to ``measure``
MEASURE_OPTIONS = frozenset(
    {
        "probe",
        "seeds",
        "n",
        "template",
        "estimator",
        "batch_size",
        "progress",
        "granularity",
        "probe_split",
    }  # fmt: skip
)


def _audit(command: str, data: Any, measure_options: dict[str, Any]) -> AuditResult:
    """A probe frame (or a model / list of models, measured first) -> an audit."""
    unknown = sorted(set(measure_options) - MEASURE_OPTIONS)
    if unknown:
        raise CdscopeError(
            f"{command} has no argument {unknown[0]!r}; a model is measured with "
            f"{', '.join(sorted(MEASURE_OPTIONS))}"
        )
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


@_api
def bshared(data: Any, **measure_options: Any) -> AuditResult:
    """B_shared(C) = lambda_1(C C^T) / tr(C C^T) and R(C) per model and seed (SPEC §3),
    mean ± SE over seeds and paired rows against the first model (SPEC §4).

    ``data``: a probe frame from ``measure``, or model(s) measured here with
    ``measure_options`` (probe=, seeds=, n=, ...)."""
    return _audit("bshared", data, measure_options)


@_api
def acg(data: Any, **measure_options: Any) -> AuditResult:
    """ACG = B_shared(F) - B_shared(C) per model and seed (SPEC §3); as ``bshared``."""
    return _audit("acg", data, measure_options)


@_api
def decompose(data: Any, **measure_options: Any) -> AuditResult:
    """B_dir, B_norm, pairwise |cos| of C's rows and each family's participation ratio
    (SPEC §3); as ``bshared``."""
    return _audit("decompose", data, measure_options)


@_api
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


@_api
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

    families = _whole("families", families, 2, MAX_FAMILIES)
    gates = None if gates is None else _whole("gates", gates, 1, MAX_GATES)
    trials = _whole("trials", trials, 1, MAX_TRIALS)
    seed = _whole("seed", seed, 0, SEED_MAX)
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise CdscopeError(f"value is a B_shared fraction, not {type(value).__name__} {value!r}")
    spec = None
    if isinstance(model, LoadedModel):
        gates = gates if gates is not None else gate_count(model.model)
        spec = model.name
    elif model is not None:
        spec = str(model)
    if spec is not None and gates is None:  # K of a model loaded here: quietly, as load_model
        from cdscope.core.models.opening import library_bars_off

        with library_bars_off():
            return random_reference_result(families, gates, trials, seed, value, spec)
    return random_reference_result(families, gates, trials, seed, value, spec)


@_api
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


@_api
def read_results(path: str | Path) -> pd.DataFrame:
    """A Parquet file written by the CLI (or this API) as a DataFrame; its run metadata
    (models with revisions, probe hash, settings) is in ``frame.attrs["cdscope"]``."""
    from cdscope.io import read_parquet

    frame, metadata = read_parquet(path)
    frame.attrs["cdscope"] = metadata
    return frame
