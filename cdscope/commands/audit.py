"""Shared engine of ``bshared``, ``acg`` and ``decompose`` (SPEC §3, §4).

1. Obtain the probe frame (C, F, l_m per model, seed, family, gate): measure the
   models (``collect_control``) or read an earlier ``probe`` Parquet (``--from``);
   ``audit_run.run_audit`` does this and writes the outputs.
2. Per (model, seed): evaluate the command's measures on the kept families' C and F.
3. Over seeds: mean ± SE per model and measure; against the first model, same-seed
   paired differences Delta_s = value_model(s) - value_reference(s) with SE, the count
   of negative Delta_s and the 95% Student-t interval.

Outputs, written as one set (``cdscope.fileset``: all or nothing, one writer at a time):
``OUT`` (one row per model x seed x measure), ``OUT.summary.parquet`` (means and paired
rows), ``OUT.convergence.parquet``, the figure and, when models were measured,
``OUT.probe.parquet`` (the raw probe frame, reusable with ``--from`` and ``--resume``).

The tables are tidy (docs/api.md): a measure of one family (PR, top1%) names it in
``family``, a measure of a family pair (abs_cos) in ``family`` and ``family_b``, and
``value_unit`` says what ``value`` (and ``mean``, ``se``, ...) is in: ``fraction`` for every
measure but the participation ratio, which is a number of ``gates`` (SPEC §3). ``per_seed_frame``
is the one place the rows are built.

Additions that leave the plain, paper-comparable numbers unchanged (docs/bshared.md):
per (model, seed) the noise-corrected measures (``*_unbiased``, ``noise.unbiased_gram``,
always with the eigenvalue mass clipped to read them, ``gram_negative_mass``, and a note
where it exceeds ``noise.CLIPPED_MASS_WARN``; an estimator of another quantity, never to be
compared with the plain one) and the bootstrap spread over probe samples of every measure
(``boot_low``/``boot_high``: at n = 2-3 samples per family its coverage is unknown, so it
is not called a confidence interval; docs/decisions.md); on paired rows the per-seed Delta
SD and the seeds a paired t-test needs to detect the stated target ``detect`` at 80 %
power, with the range the SD's own chi-square interval allows (``seeds_needed_low`` /
``_high``; never computed at the observed mean); per model the Davis-Kahan direction
check (``OUT.convergence``). These need the per-sample probe columns; an older probe file
gets a one-line note.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from cdscope.analysis import spectral
from cdscope.analysis.noise import CLIPPED_MASS_WARN
from cdscope.analysis.stats import (
    mean_se,
    paired_difference,
    seeds_needed,
    seeds_needed_interval,
)
from cdscope.analysis.uncertainty import (
    MeasureFn,
    MeasureKey,
    bootstrap_intervals,
    corrected_measures,
    direction_stability,
)
from cdscope.commands.audit_inputs import check_probe_frame
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet
from cdscope.io import run_metadata
from cdscope.messages import warn
from cdscope.output.frames import (
    control_matrices,
    sample_sets,
)
from cdscope.output.notebook import audit_html, audit_repr
from cdscope.output.render import measure_name
from cdscope.settings import AuditSettings


def bshared_measures(families: list[str], C: np.ndarray, F: np.ndarray) -> dict[str, float]:  # noqa: N803
    return {"B_shared_C": float(spectral.b_shared(C)), "R_C": float(spectral.moment_ratio(C))}


def acg_measures(families: list[str], C: np.ndarray, F: np.ndarray) -> dict[str, float]:  # noqa: N803
    b_f, b_c = float(spectral.b_shared(F)), float(spectral.b_shared(C))
    return {"B_shared_F": b_f, "B_shared_C": b_c, "ACG": b_f - b_c}


#: decompose's point on the cumulative |C| mass curve: the share carried by the top 1 % of gates
TOP_FRACTION = 0.01


def decompose_measures(
    families: list[str], C: np.ndarray, F: np.ndarray
) -> dict[MeasureKey, float]:  # noqa: N803
    values: dict[MeasureKey, float] = {
        "B_shared_C": float(spectral.b_shared(C)),
        "B_dir": float(spectral.b_dir(C)),
        "B_norm": float(spectral.b_norm(C)),
    }
    for a, b, cos in spectral.pairwise_abs_cos(C, families):
        values["abs_cos", a, b] = cos
    for family, pr in zip(families, spectral.participation_ratio(C), strict=True):
        values["PR", family] = float(pr)
    for family, share in zip(families, spectral.top_share(C, TOP_FRACTION), strict=True):
        values["top1%", family] = float(share)  # the mass curve at 1 % of the gates
    return values


#: what a measure's values are in: every audit measure is a fraction (a share of a trace
#: or of sum |C|, a cosine, or a difference of shares) but the participation ratio, a
#: number of gates in [1, K] (SPEC §3)
UNITS = {"PR": "gates"}
#: the columns that name one measured quantity in every audit table
MEASURE_COLUMNS = ["measure", "family", "family_b", "value_unit"]
#: boot_low / boot_high: the centred bootstrap spread over probe samples, not a confidence
#: interval (its coverage at n = 3 per family is unknown; docs/decisions.md)
PER_SEED_COLUMNS = ["model", "seed", *MEASURE_COLUMNS, "value", "boot_low", "boot_high"]


def measure_columns(key: MeasureKey) -> dict[str, str | None]:
    """A measure function's key -> the tidy columns: ``"B_dir"``, ``("PR", family)`` or
    ``("abs_cos", family, family_b)``."""
    name, family, family_b = (key, None, None) if isinstance(key, str) else (*key, None)[:3]
    return {"measure": name, "family": family, "family_b": family_b,
            "value_unit": UNITS.get(name, "fraction")}  # fmt: skip


def _measure_groups(frame: pd.DataFrame, by: list[str]):  # noqa: ANN202
    """``frame.groupby(by + MEASURE_COLUMNS)`` keeping the rows whose family is None,
    each key with None (not NaN) for an absent family."""
    for key, group in frame.groupby(by + MEASURE_COLUMNS, sort=False, dropna=False):
        yield tuple(None if isinstance(k, float) and k != k else k for k in key), group


@dataclass(frozen=True)
class AuditSpec:
    """One audit command: its measure function and what its outputs show first."""

    command: str
    measures: MeasureFn
    headline: str  # the measure the per-seed table, print(result) and the report show first
    plot_measures: tuple[str, ...]  # the measures the figure's bars show, in order
    title: str  # the title of the figure's bars
    gated: str = "B_shared_C"  # the measure --fail-above and the report's verdict compare
    k_dependent: tuple[str, ...] = ()  # measures whose scale depends on K
    corrected: tuple[str, ...] = ()  # noise-corrected measures added (uncertainty.CORRECTED)

    @property
    def gated_label(self) -> str:
        """How messages name the gated measure: ``B_shared(C)``."""
        return measure_name(self.gated)


AUDITS = {
    "bshared": AuditSpec(
        "bshared",
        bshared_measures,
        "B_shared_C",
        ("B_shared_C", "B_shared_C_unbiased"),
        "B_shared(C), plain | noise-corrected (not comparable)",
        corrected=("B_shared_C_unbiased", "R_C_unbiased", "gram_negative_mass"),
    ),
    "acg": AuditSpec(
        "acg",
        acg_measures,
        "ACG",
        ("B_shared_F", "B_shared_C", "ACG"),
        "Activation vs control",
        corrected=("B_shared_C_unbiased", "gram_negative_mass"),
    ),
    "decompose": AuditSpec(
        "decompose",
        decompose_measures,
        "B_shared_C",
        ("B_shared_C", "B_dir", "B_norm"),
        "Bottleneck decomposition",
        k_dependent=("PR", "top1%"),
        corrected=(
            "B_shared_C_unbiased",
            "B_dir_unbiased",
            "B_norm_unbiased",
            "gram_negative_mass",
        ),
    ),
}

#: default target effect of the seeds-needed column (a fraction): ``AuditSettings.detect``,
#: the magnitude of the paper's paired Delta B_shared (-5.5 points)
DETECT = AuditSettings.detect / 100


@dataclass
class AuditResult:
    """One audit's tables, each in the schema of the Parquet file the CLI writes."""

    command: str  # bshared | acg | decompose
    # the tidy tables (module doc): the measure in measure / family / family_b / value_unit
    per_seed: pd.DataFrame  # model, seed, <measure>, value, boot_low, boot_high (bootstrap)
    summary: pd.DataFrame  # model, <measure>, n_seeds, mean, se
    paired: pd.DataFrame  # model, reference, <measure>, n, mean, se, n_negative, ci_* (t), sd, ...
    metadata: dict
    probe_frame: pd.DataFrame
    skipped_pairs: list[str]
    convergence: pd.DataFrame  # model, seed, angle_deg, dk_bound_deg, eigengap, gate_angle_deg
    notes: list[str]

    def tables(self) -> dict[str, pd.DataFrame]:
        """The result's tables by attribute name."""
        names = ("summary", "paired", "per_seed", "convergence", "probe_frame")
        return {name: getattr(self, name) for name in names}

    def __repr__(self) -> str:  # print(result): the headline per model, not 60 lines
        return audit_repr(self.command, AUDITS[self.command].headline, self.tables())

    def _repr_html_(self) -> str:
        return audit_html(self.command, AUDITS[self.command].headline, self.tables())


def exceeding(summary: pd.DataFrame, fail_above: float, measure: str = "B_shared_C") -> list[str]:
    """The models whose mean ``measure`` (an audit's ``AuditSpec.gated``) is above
    ``fail_above`` percent, as 'model 87.3%' (the verdict of ``--fail-above``; empty: passed)."""
    means = summary[summary["measure"] == measure]
    return [
        f"{r.model} {100 * r.mean:.1f}%" for r in means.itertuples() if 100 * r.mean > fail_above
    ]


def sibling(out: Path, suffix: str) -> Path:
    """``results/bshared.parquet`` -> ``results/bshared.<suffix>.parquet``."""
    return out.with_name(f"{out.stem}.{suffix}{out.suffix or '.parquet'}")


def per_seed_frame(
    probe_frame: pd.DataFrame,
    spec: AuditSpec,
    console: Console,
    bootstrap: int = 1000,
    notes: list[str] | None = None,
) -> pd.DataFrame:
    """Evaluate ``spec``'s measures for every (model, seed) on the kept families' C and F,
    plus the noise-corrected measures and the bootstrap spread where per-sample data exist."""
    rows = []
    notes = notes if notes is not None else []
    samples = sample_sets(probe_frame)
    kept = probe_frame[~probe_frame["dropped"].astype(bool)]
    for model, seed in probe_frame[["model", "seed"]].drop_duplicates().itertuples(index=False):
        part = kept[(kept["model"] == model) & (kept["seed"] == seed)]
        C = part.pivot(index="family", columns="gate", values="C").sort_index()  # noqa: N806
        F = part.pivot(index="family", columns="gate", values="F").reindex(C.index)  # noqa: N806
        if len(C) < 2:
            warn(console, f"{model} seed {seed}: fewer than 2 families kept; no measures")
            continue
        families = list(C.index)
        values = spec.measures(families, C.to_numpy(), F.to_numpy())
        intervals: dict[str, tuple[float, float]] = {}
        found = samples.get((model, int(seed)))
        if found is None:
            notes.append(
                "per-sample columns absent (older probe file): no *_unbiased, no intervals"
            )
        else:
            sets = found[1]
            if min(len(s.logp) for s in sets) < 2 and spec.corrected:
                notes.append("n = 1: the unbiased Gram needs n >= 2 samples per family")
            values |= corrected_measures(sets, spec.corrected)
            if bootstrap > 0:
                intervals = bootstrap_intervals(  # centred on the values: contain them
                    families, sets, spec.measures, spec.corrected, bootstrap, int(seed),
                    estimates=values,
                )  # fmt: skip
        for key, value in values.items():
            lo, hi = intervals.get(key, (np.nan, np.nan))
            rows.append(
                {"model": model, "seed": int(seed), **measure_columns(key), "value": value,
                 "boot_low": lo, "boot_high": hi}
            )  # fmt: skip
    # the string dtype the Parquet file reads back as, so API and file frames are equal
    return pd.DataFrame(rows, columns=PER_SEED_COLUMNS).astype({"family": "str", "family_b": "str"})


def convergence_frame(probe_frame: pd.DataFrame) -> pd.DataFrame:
    """Per model with >= 2 seeds: the Davis-Kahan direction check of its C (uncertainty.py)."""
    by_model: dict[str, dict[int, np.ndarray]] = {}
    for (model, seed), (families, C) in control_matrices(probe_frame).items():
        if len(families) >= 2:
            by_model.setdefault(model, {})[seed] = C
    parts = [
        direction_stability(mats).assign(model=model)
        for model, mats in by_model.items()
        if len(mats) >= 2
    ]
    columns = ["model", "seed", "angle_deg", "dk_bound_deg", "eigengap", "gate_angle_deg"]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


def summarize_seeds(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Mean ± SE over seeds per (model, measure) (SPEC §4)."""
    rows = []
    for key, group in _measure_groups(per_seed, ["model"]):
        mean, se = mean_se(group["value"].to_numpy())
        rows.append(
            {**dict(zip(["model", *MEASURE_COLUMNS], key, strict=True)), "n_seeds": len(group),
             "mean": mean, "se": se}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=["model", *MEASURE_COLUMNS, "n_seeds", "mean", "se"])


def paired_against_reference(
    per_seed: pd.DataFrame,
    models: list[str],
    skip: Callable[[str, str], bool] = lambda m, name: False,
    detect: float = DETECT,
) -> pd.DataFrame:
    """Same-seed differences of every later model against ``models[0]`` (SPEC §4), with the
    per-seed Delta SD and the seeds a two-sided paired t-test (alpha 0.05) needs to detect
    the stated target ``detect`` (a fraction; never the observed mean) with 80 % power
    (``stats.seeds_needed``), and its range from the SD's 95 % chi-square interval
    (``stats.seeds_needed_interval``). A measure not in fractions (PR, in gates) has no
    target in points: NaN there."""
    columns = [
        "model",
        "reference",
        *MEASURE_COLUMNS,
        "n",
        "mean",
        "se",
        "n_negative",
        "ci_low",
        "ci_high",
        "sd",
        "detect",
        "seeds_needed",
        "seeds_needed_low",
        "seeds_needed_high",
    ]
    if len(models) < 2:
        return pd.DataFrame(columns=columns)
    reference, rows = models[0], []
    for model in models[1:]:
        for key, group in _measure_groups(per_seed, []):
            if skip(model, key[0]):
                continue
            wide = group.pivot(index="seed", columns="model", values="value")
            if model not in wide or reference not in wide:
                continue
            pairs = wide[[model, reference]].dropna()
            if pairs.empty:
                continue
            diff = paired_difference(pairs[model].to_numpy(), pairs[reference].to_numpy())
            sd = float(np.std(diff.deltas, ddof=1)) if diff.n > 1 else float("nan")
            target = detect if key[3] == "fraction" else float("nan")
            low, high = seeds_needed_interval(target, sd, diff.n)
            rows.append(
                {
                    "model": model,
                    "reference": reference,
                    **dict(zip(MEASURE_COLUMNS, key, strict=True)),
                    "n": diff.n,
                    "mean": diff.mean,
                    "se": diff.se,
                    "n_negative": diff.n_negative,
                    "ci_low": diff.ci_low,
                    "ci_high": diff.ci_high,
                    "sd": sd,
                    "detect": target,
                    "seeds_needed": seeds_needed(target, sd),
                    "seeds_needed_low": low,
                    "seeds_needed_high": high,
                }
            )
    return pd.DataFrame(rows, columns=columns)


def clipped_mass_notes(per_seed: pd.DataFrame, limit: float = CLIPPED_MASS_WARN) -> list[str]:
    """One note per model whose noise-corrected Gram had more than ``limit`` of its
    eigenvalue mass clipped on some seed (noise.CLIPPED_MASS_WARN: why 5 %)."""
    rows = per_seed[(per_seed["measure"] == "gram_negative_mass") & (per_seed["value"] > limit)]
    return [
        f"{model}: the noise-corrected Gram clipped more than {100 * limit:g}% of its "
        f"eigenvalue mass on seed(s) {', '.join(str(int(s)) for s in group['seed'])} "
        f"(max {100 * group['value'].max():.1f}%): its *_unbiased measures are unreliable there"
        for model, group in rows.groupby("model", sort=False)
    ]


def evaluate_audit(
    spec: AuditSpec,
    probe_frame: pd.DataFrame,
    probe_meta: dict,
    console: Console,
    *,
    source: str = "measured",
    out: Path | None = None,
    audit: AuditSettings = AuditSettings(),
    outputs: FileSet | None = None,
) -> AuditResult:
    """Per-seed measures, their summary, paired rows and the direction check from a probe
    frame (``audit``: the bootstrap resamples, the effect the seeds-needed column detects
    and the CI gate's threshold, recorded in the metadata); written (per-seed to ``out``,
    summary and convergence beside it) when ``out`` is given, into ``outputs`` (a set of
    these three files alone when None)."""
    check_probe_frame(probe_frame)
    models = list(dict.fromkeys(probe_frame["model"]))
    refused = _KRefusals(spec, models, probe_meta)
    notes: list[str] = []
    per_seed = per_seed_frame(probe_frame, spec, console, audit.bootstrap, notes)
    if per_seed.empty:  # before anything is written: no half set of outputs
        raise CdscopeError(
            "no (model, seed) had at least 2 families with |l_m| >= 1e-4; nothing to report"
        )
    notes = sorted(set(notes)) + clipped_mass_notes(per_seed)
    for note in notes:
        warn(console, note, "note:")
    summary = summarize_seeds(per_seed)
    paired = paired_against_reference(per_seed, models, refused.skip, audit.detect / 100)
    convergence = convergence_frame(probe_frame)
    if refused.skipped:
        warn(
            console,
            "paired deltas refused for K-dependent measures of models with "
            f"different gate counts: {'; '.join(refused.skipped)}",
            "note:",
        )
    metadata = run_metadata(
        spec.command,
        source=source,
        probe=probe_meta,
        reference_model=models[0] if models else None,
        bootstrap=audit.bootstrap,
        detect=audit.detect / 100,
        notes=notes,
        **({"fail_above": audit.fail_above} if audit.fail_above is not None else {}),
    )
    if out is not None:
        both = pd.concat([summary.assign(kind="mean"), paired.assign(kind="paired")])
        tables = {out: per_seed, sibling(out, "summary"): both.reset_index(drop=True),
                  sibling(out, "convergence"): convergence}  # fmt: skip
        with contextlib.nullcontext(outputs) if outputs else FileSet(*tables) as files:
            for path, table in tables.items():
                files.write_parquet(table, path, metadata)
    return AuditResult(
        spec.command, per_seed, summary, paired, metadata, probe_frame, refused.skipped,
        convergence, notes,
    )  # fmt: skip


class _KRefusals:
    """Paired deltas of K-dependent measures (``AuditSpec.k_dependent``) between models
    with different gate counts are refused; ``skipped`` says which, once each."""

    def __init__(self, spec: AuditSpec, models: list[str], probe_meta: dict) -> None:
        self.spec, self.models = spec, models
        self.ks = {m["name"]: m.get("K") for m in probe_meta.get("models", [])}
        self._skipped: list[str] = []

    def skip(self, model: str, measure: str) -> bool:
        reference = self.models[0]
        differs = self.ks.get(model) != self.ks.get(reference)
        if differs and measure in self.spec.k_dependent:
            self._skipped.append(
                f"{measure} ({model} K={self.ks.get(model)} vs {reference} K={self.ks.get(reference)})"
            )
            return True
        return False

    @property
    def skipped(self) -> list[str]:
        return sorted(set(self._skipped))
