"""``cdscope nsweep``: plain and noise-corrected B_shared(C) against the probe size n (SPEC §4).

B_shared is an n-dependent estimator: per-sample noise inflates the diagonal of the
plain Gram by tr Cov(c_m) / n and pulls B_shared towards 1/M at small n. This workflow
shows how much, and how much of it the U-statistic Gram (``noise.unbiased_gram``) removes.

1. Per (model, seed) one per-sample probe with n_max = max(ns) samples per family
   (``collect_control``; or an earlier probe file with per-sample columns via --from).
2. For each n in ns: per family, the first n samples of a seeded permutation of the
   n_max drawn ones (nested draws: the n = 3 subset lies inside the n = 6 subset). The
   first n of a uniformly random ordering of a uniform without-replacement draw are a
   uniform without-replacement draw of n from the pool, so each n is distributed as a
   fresh probe of size n; nesting only correlates the n-values within a seed, which makes
   the curves smoother, not biased. The subsets are not the items ``bshared --n n`` would
   draw for the same seed (SPEC §4 draws n items directly), so per-seed values differ
   from bshared's; their distribution over seeds is the same.
3. l_m = mean log pi over the subset; plain B_shared of C = mean dlog pi / l_m; the
   corrected B_shared of the unbiased Gram of c_{m,i} = dlog pi_i / l_m (n >= 2).

Outputs: ``OUT`` (model, seed, n, measure, value), ``OUT.summary.parquet`` (mean ± SE
over seeds per model, n and measure) and, when measured, ``OUT.probe.parquet``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from rich.console import Console

from cdscope.analysis import spectral
from cdscope.analysis.stats import mean_se
from cdscope.analysis.uncertainty import FamilySamples, contributions, corrected_measures
from cdscope.commands.audit import sibling
from cdscope.commands.audit_run import obtain_probe_frame
from cdscope.errors import CdscopeError
from cdscope.fileset import FileSet
from cdscope.io import run_metadata
from cdscope.output.frames import ModelOptions, ProbeSettings, sample_sets

NS_DEFAULT = (1, 2, 3, 6, 12, 24)
MEASURES = ("B_shared_C", "B_shared_C_unbiased", "gram_negative_mass")


@dataclass
class NsweepResult:
    per_seed: pd.DataFrame  # model, seed, n, measure, value
    summary: pd.DataFrame  # model, n, measure, n_seeds, mean, se
    metadata: dict


def nested_subsets(
    families: Sequence[str], sets: Sequence[FamilySamples], seed: int, ns: Sequence[int]
) -> dict[int, list[FamilySamples]]:
    """{n: per family, the first n samples of a permutation seeded by (seed, family)}."""
    orders = [
        np.random.default_rng([seed, zlib.crc32(f.encode()), 1]).permutation(len(s.logp))
        for f, s in zip(families, sets, strict=True)
    ]
    return {
        n: [FamilySamples(s.logp[o[:n]], s.dlogp[o[:n]], s.F[o[:n]]) for s, o in zip(sets, orders, strict=True)]
        for n in ns
    }  # fmt: skip


def sweep_frame(probe_frame: pd.DataFrame, ns: Sequence[int]) -> pd.DataFrame:
    """Plain and corrected B_shared(C) for every (model, seed) and n in ``ns`` (module doc)."""
    rows = []
    for (model, seed), found in sample_sets(probe_frame).items():
        if found is None:
            raise CdscopeError(
                "the probe file has no per-sample columns (written by an older cdscope); "
                "measure again with nsweep --model"
            )
        families, sets = found
        smallest = min(len(s.logp) for s in sets)
        if smallest < max(ns) or len(families) < 2:
            raise CdscopeError(
                f"{model} seed {seed}: {smallest} sample(s) per family and {len(families)} "
                f"famil(ies); the sweep needs n >= {max(ns)} and 2 families (lower --ns or measure again)"
            )
        for n, subset in nested_subsets(families, sets, seed, ns).items():
            C = np.stack([c.mean(axis=0) for c in contributions(subset)])  # noqa: N806
            values = {"B_shared_C": float(spectral.b_shared(C))} | corrected_measures(
                subset, MEASURES
            )
            rows += [
                {"model": model, "seed": seed, "n": n, "measure": k, "value": v}
                for k, v in values.items()
            ]
    return pd.DataFrame(rows, columns=["model", "seed", "n", "measure", "value"])


def summarize_sweep(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Mean ± SE over seeds per (model, n, measure) (SPEC §4)."""
    rows = []
    for (model, n, measure), group in per_seed.groupby(["model", "n", "measure"], sort=False):
        mean, se = mean_se(group["value"].to_numpy())
        rows.append(
            {"model": model, "n": int(n), "measure": measure, "n_seeds": len(group),
             "mean": mean, "se": se}
        )  # fmt: skip
    return pd.DataFrame(rows, columns=["model", "n", "measure", "n_seeds", "mean", "se"])


def parse_ns(text: str) -> tuple[int, ...]:
    """'1,2,3,6' -> (1, 2, 3, 6): sorted, distinct, each >= 1."""
    try:
        ns = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise CdscopeError(
            f"--ns takes comma-separated integers like 1,2,3,6; got {text!r}"
        ) from None
    if not ns or ns[0] < 1:
        raise CdscopeError(f"--ns values must be at least 1; got {text!r}")
    return tuple(ns)


def run_nsweep(
    out: Path,
    ns: Sequence[int],
    model_specs: list[str] | None,
    from_path: Path | None,
    settings: ProbeSettings,
    probe_paths: list[Path] | None,
    options: ModelOptions,
    resume: bool | str,
    console: Console,
    plot: Path | None = None,
) -> NsweepResult:
    """Measure (n = max(ns) per family) or read the per-sample probe, sweep n, write the
    outputs (and the figure at ``plot``) as one set (``cdscope.fileset``)."""
    probe = [sibling(out, "probe")] if from_path is None else []
    with FileSet(out, sibling(out, "summary"), *probe, plot) as outputs:
        probe_frame, probe_meta = obtain_probe_frame(
            "nsweep", out, model_specs, from_path, settings, probe_paths, options, resume,
            console, outputs=outputs,
        )  # fmt: skip
        per_seed = sweep_frame(probe_frame, ns)
        summary = summarize_sweep(per_seed)
        metadata = run_metadata(
            "nsweep",
            ns=list(ns),
            nesting="first n of a per-(seed, family) permutation of the n_max drawn samples",
            source=str(from_path) if from_path else "measured",
            probe=probe_meta,
        )
        outputs.write_parquet(per_seed, out, metadata)
        outputs.write_parquet(summary, sibling(out, "summary"), metadata)
        if plot is not None:
            from cdscope.output.plots_noise import plot_nsweep

            M = len(probe_meta.get("families") or [])  # noqa: N806
            plot_nsweep(outputs.path(plot), per_seed, summary, M or 2)
    return NsweepResult(per_seed, summary, metadata)
