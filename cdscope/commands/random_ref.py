"""``random-ref``: B_shared of i.i.d. Gaussian M x K matrices as a reference (SPEC §4).

The 1/M lower bound is not what a random matrix gives; this distribution is. The CLI
command runs ``run_random_reference`` (checks, samples, writes, draws);
``cdscope.random_reference`` calls ``random_reference_result`` (no writes).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cdscope.analysis.spectral import BARTLETT_K, RandomReference, random_reference
from cdscope.errors import CdscopeError, in_python, option
from cdscope.fileset import FileSet
from cdscope.io import check_parquet_output, check_plot_path, run_metadata
from cdscope.settings import RandomRefSettings
from cdscope.settings.names import SUBLAYER

MAX_ELEMENTS = 1 << 22  # M x max(M, K) of one random-ref trial (32 MiB of float64)
ROUNDING = 0.0005  # half the 0.1 % step of the tables: how far a typed --value may undercut 1/M


@dataclass(frozen=True)
class RandomReferenceResult:
    """The reference distribution and its statistics (``value``/``percentile`` if given)."""

    reference: RandomReference
    stats: dict

    @property
    def frame(self) -> pd.DataFrame:
        """One row per trial (``trial``, ``B_shared``): the schema of the CLI's Parquet."""
        ref = self.reference
        return pd.DataFrame({"trial": range(ref.trials), "B_shared": ref.samples})

    def __repr__(self) -> str:
        from cdscope.output.notebook import reference_repr

        return reference_repr(self.stats)

    def _repr_html_(self) -> str:
        from cdscope.output.notebook import reference_html

        return reference_html(self.stats)


def random_reference_result(
    families: int = 3,
    gates: int | None = None,
    trials: int = 50_000,
    seed: int = 0,
    value: float | None = None,
    model: str | None = None,
    granularity: str = SUBLAYER,
) -> RandomReferenceResult:
    """Check the inputs, take K from ``model`` when ``gates`` is None, sample, summarise.

    ``value`` is a measured B_shared as a fraction in [1/M, 1] (B_shared of M rows is never
    below 1/M); its percentile among the samples is reported.
    """
    if families < 2:
        raise CdscopeError(
            f"{option('families')} must be at least 2 (B_shared of one row is always 1); "
            f"got {families}"
        )
    if trials < 1:
        raise CdscopeError(f"{option('trials')} must be at least 1; got {trials}")
    # the tables print B_shared to 0.1 %: a value typed from them may sit 0.05 points below
    if value is not None and not 1 / families - ROUNDING <= value <= 1:  # NaN fails both
        raise CdscopeError(value_range_error(families, value))
    if gates is None:
        if model is None:
            ask = "gates=K, or model=" if in_python() else "--gates K, or --model"
            raise CdscopeError(f"give {ask} to take K from a model")
        gates = model_gate_count(model, granularity)
    if gates < 1:
        raise CdscopeError(f"{option('gates')} must be at least 1; got {gates}")
    drawn = families if gates >= max(BARTLETT_K, families) else gates  # X, or G directly
    if families * max(families, drawn) > MAX_ELEMENTS:  # one trial's X and X X^T
        raise CdscopeError(
            f"{option('families', families)} x {option('gates', gates)} needs "
            f"{8 * families * max(families, drawn) / 2**30:.1f} GiB per random matrix; "
            f"M x max(M, K) must stay below {MAX_ELEMENTS:,}"
        )
    ref = random_reference(families, gates, trials, seed)
    stats = {
        "M": families,
        "K": gates,
        "trials": trials,
        "seed": seed,
        "mean": ref.mean,
        "std": ref.std,
        "p95": ref.p95,
        "p99": ref.p99,
        "value": value,
        "percentile": None if value is None else ref.percentile_of(value),
        "model": model,
        "granularity": granularity if model is not None else None,
    }
    return RandomReferenceResult(ref, stats)


def value_range_error(families: int, value: float) -> str:
    """The refusal of a measured B_shared outside [1/M, 1], in the caller's unit: percent
    as typed on the command line (``--value``), a fraction in Python (``value=``), where a
    percentage is the likely slip and is named as one."""
    if not in_python():
        return (
            f"--value is a percentage between 1/M = {100 / families:.4g} (no B_shared of "
            f"M = {families} families is lower) and 100; got {100 * value:g}"
        )
    slip = f" ({value:g}% is {value / 100:g})" if 1 < value <= 100 else ""
    return (
        f"value is a B_shared fraction between 1/M = {1 / families:.4g} (no B_shared of "
        f"M = {families} families is lower) and 1, not a percentage; got {value:g}{slip}"
    )


def run_random_reference(
    reference: RandomRefSettings, out: Path, plot: Path | None = None
) -> tuple[RandomReferenceResult, Path]:
    """The ``random-ref`` workflow: output paths checked before sampling, the T samples
    written to ``out`` (statistics in its metadata), the histogram to ``plot``."""
    target = check_parquet_output(out)
    if plot is not None:
        check_plot_path(plot)
    value = None if reference.value is None else reference.value / 100
    result = random_reference_result(
        reference.families, reference.gates, reference.trials, reference.seed, value,
        reference.model, reference.granularity or SUBLAYER,
    )  # fmt: skip
    with FileSet(target, plot) as outputs:  # the samples and the figure: both or neither
        outputs.write_parquet(result.frame, target, run_metadata("random-ref", **result.stats))
        if plot is not None:
            draw_random_reference(outputs.path(plot), result)
    return result, target


def draw_random_reference(path: Path | None, result: RandomReferenceResult, ax: Any = None) -> Any:
    """The histogram with 1/M, p95, p99 and the measured value (``--plot``): the Figure,
    written to ``path`` when given; ``ax``: drawn on the caller's Axes."""
    from cdscope.output.plots import random_reference_figure, save_figure

    ref, stats = result.reference, result.stats
    fig = random_reference_figure(
        ref.samples, ref.M, ref.K, ref.p95, ref.p99, stats["value"], stats["percentile"], ax
    )
    if path is not None:
        save_figure(fig, path)
    return fig


def gate_count(model: object, granularity: str = SUBLAYER) -> int:
    """K of ``model`` (an ``nn.Module``) at ``granularity``, as every measurement counts it:
    at sublayer, the residual writes of its proven architecture description (discovered
    from its forward, not ``2 x layers``: hybrids and MoE blocks differ); finer, the gates of
    ``GatedModel``'s gate set; at edge, the edges of its EAP graph."""
    from cdscope.core.granularities import gates_for
    from cdscope.settings import ProbeSettings

    ProbeSettings((0,), granularity=granularity)  # one line for an unknown granularity
    return gates_for(model, granularity).K


def model_gate_count(spec: str, granularity: str = SUBLAYER) -> int:
    """``gate_count`` of the model ``spec`` names, loaded on the CPU (the model stack loads
    only when asked for)."""
    from cdscope.core.models.opening import ModelOptions
    from cdscope.settings import ProbeSettings

    ProbeSettings((0,), granularity=granularity)  # refused before the load
    return gate_count(ModelOptions(device="cpu").load(spec).model, granularity)
