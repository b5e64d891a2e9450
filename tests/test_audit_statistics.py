"""The statistics the audits report (issue 36), one test per rule:

1. seeds needed are for a stated target effect, never the observed mean (audits and the
   replication report);
2. they carry the range the SD's own uncertainty allows;
3. a bootstrap spread of unknown coverage is not stored or printed as a confidence interval;
4. a noise-corrected measure carries its clipped eigenvalue mass, with a note above the
   documented threshold;
5. plain and noise-corrected B_shared are never presented as comparable;
6. docs/gradcheck.md names the default estimator the settings hold.
"""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from cdscope.analysis.noise import CLIPPED_MASS_WARN, gram_measures, psd_part
from cdscope.analysis.stats import seeds_needed, seeds_needed_interval
from cdscope.analysis.uncertainty import FamilySamples, corrected_measures
from cdscope.commands.audit import (
    AUDITS,
    DETECT,
    PER_SEED_COLUMNS,
    clipped_mass_notes,
    paired_against_reference,
    per_seed_frame,
)
from cdscope.output.notebook import audit_repr
from cdscope.output.render import NOT_COMPARABLE, audit_caption, audit_table, per_seed_table
from cdscope.schemas import COLUMNS
from cdscope.settings import DEFAULT_ESTIMATOR, GRADIENT_ESTIMATORS, AuditSettings

ROOT = Path(__file__).resolve().parents[1]


def _per_seed(values: dict[str, list[float]], measure: str = "B_shared_C", unit: str = "fraction"):
    """A per-seed frame: model -> one value per seed."""
    rows = [
        {"model": m, "seed": s, "measure": measure, "family": None, "family_b": None,
         "value_unit": unit, "value": v}
        for m, vs in values.items() for s, v in enumerate(vs)
    ]  # fmt: skip
    return pd.DataFrame(rows)


# 1 ---------------------------------------------------------------------------------------


def test_seeds_needed_is_for_the_stated_target_not_the_observed_mean() -> None:
    base = [0.60, 0.70, 0.65, 0.62]
    shifts = [0.01, -0.03, 0.02, 0.00]
    near = _per_seed({"a": base, "b": [x + d for x, d in zip(base, shifts, strict=True)]})
    far = _per_seed({"a": base, "b": [x + d + 0.2 for x, d in zip(base, shifts, strict=True)]})
    rows = [paired_against_reference(f, ["a", "b"]).iloc[0] for f in (near, far)]
    sd = float(np.std(shifts, ddof=1))
    assert rows[0]["mean"] != rows[1]["mean"]  # another observed mean, the same SD ...
    for row in rows:  # ... the same seeds needed: they answer for the target alone
        assert row["detect"] == DETECT == AuditSettings.detect / 100 == 0.055
        assert row["seeds_needed"] == seeds_needed(0.055, sd) != seeds_needed(row["mean"], sd)
    # a measure not in fractions (PR, in gates) has no target in points
    gates = paired_against_reference(_per_seed({"a": base, "b": base}, "PR", "gates"), ["a", "b"])
    assert math.isnan(gates.iloc[0]["detect"]) and math.isnan(gates.iloc[0]["seeds_needed"])


def test_the_replication_report_uses_the_papers_effect_not_the_observed_mean() -> None:
    spec = importlib.util.spec_from_file_location(
        "replication_report", ROOT / "benchmarks/replication_report.py"
    )
    report = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(report)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    deltas = np.array([-0.02, -0.09, -0.05])
    for shift in (0.0, 0.3):
        stat = report.interval(deltas + shift, report.PAPER_EFFECT["B_shared_C"])
        sd = float(np.std(deltas, ddof=1))
        assert stat["seeds_needed"] == seeds_needed(0.055, sd)
        assert (stat["seeds_low"], stat["seeds_high"]) == seeds_needed_interval(0.055, sd, 3)
    no_target = report.interval(deltas)  # the reward gain: no stated target, no count
    assert math.isnan(no_target["seeds_needed"]) and report.seeds_text(no_target) == "n/a"


# 2 ---------------------------------------------------------------------------------------


def test_paired_rows_and_table_carry_the_seeds_range() -> None:
    frame = _per_seed({"a": [0.60, 0.70, 0.65], "b": [0.70, 0.66, 0.72]})
    paired = paired_against_reference(frame, ["a", "b"], detect=0.055)
    row = paired.iloc[0]
    expected = seeds_needed_interval(0.055, row["sd"], 3)
    assert (row["seeds_needed_low"], row["seeds_needed_high"]) == expected
    assert row["seeds_needed_low"] <= row["seeds_needed"] <= row["seeds_needed_high"]
    for column in ("detect", "seeds_needed_low", "seeds_needed_high"):
        assert COLUMNS[column] == COLUMNS["seeds_needed"]  # float64 (inf: out of reach)
    summary = (
        frame.groupby(["model", "measure", "value_unit"], as_index=False)["value"]
        .agg(mean="mean", se="sem")
        .assign(family=None, family_b=None, n_seeds=3)
    )
    console = Console(record=True, width=250)
    console.print(audit_table(summary, paired, "t"))
    text = " ".join(console.export_text().split())
    low, high = (int(row[c]) for c in ("seeds_needed_low", "seeds_needed_high"))
    assert f"{int(row['seeds_needed'])} [{low}, {high}]" in text
    assert "target Δ = 5.5 points" in text and "not the observed Δ" in text


# 3 ---------------------------------------------------------------------------------------


def _sets(rng: np.random.Generator, n: int = 3) -> list[FamilySamples]:
    return [
        FamilySamples(-rng.uniform(5, 10, n), rng.normal(size=(n, 6)), rng.uniform(size=(n, 6)))
        for _ in range(3)
    ]


def test_the_bootstrap_spread_is_not_stored_or_printed_as_a_confidence_interval(
    monkeypatch,
) -> None:
    from cdscope.commands import audit

    sets = _sets(np.random.default_rng(0))
    families = ["a", "b", "c"]
    probe = pd.DataFrame(
        [{"model": "m", "seed": 0, "family": f, "gate": k, "C": 0.1 * (k + 1) * (i + 1),
          "F": 1.0, "dropped": False} for i, f in enumerate(families) for k in range(6)]
    )  # fmt: skip
    monkeypatch.setattr(audit, "sample_sets", lambda frame: {("m", 0): (families, sets)})
    per_seed = per_seed_frame(probe, AUDITS["bshared"], Console(), bootstrap=50)
    assert list(per_seed.columns) == PER_SEED_COLUMNS
    assert {"boot_low", "boot_high"} <= set(per_seed.columns)
    assert not {"ci_low", "ci_high"} & set(per_seed.columns)
    assert per_seed["boot_low"].notna().all()
    console = Console(record=True, width=200)
    console.print(per_seed_table(per_seed, "B_shared_C", "t"))
    text = " ".join(console.export_text().split())
    assert "bootstrap spread" in text and "not a confidence interval" in text
    # eap-info's intervals over n = 5 samples are bootstrap spreads too
    from cdscope.commands.eap_info import summarise

    samples = pd.DataFrame({"model": "m", "sample_id": [str(i) for i in range(5)],
                            "intensity": np.arange(5.0), "info_complexity": 0.5, "kurtosis": 3.0})  # fmt: skip
    summary, _ = summarise(samples, ["m"], B=100, seed=0)
    assert {"boot_low", "boot_high"} <= set(summary.columns) and "ci_low" not in summary


def test_an_old_audit_files_bootstrap_columns_are_read_as_the_spread(tmp_path) -> None:
    from cdscope.commands.report import load_audit
    from cdscope.io import write_parquet

    per_seed = _per_seed({"a": [0.6, 0.7]}).assign(ci_low=[0.5, 0.6], ci_high=[0.7, 0.8])
    summary = pd.DataFrame({"model": ["a"], "measure": ["B_shared_C"], "family": [None],
                            "family_b": [None], "value_unit": ["fraction"], "n_seeds": [2],
                            "mean": [0.65], "se": [0.05], "kind": ["mean"]})  # fmt: skip
    write_parquet(per_seed, tmp_path / "b.parquet", {"command": "bshared"})
    write_parquet(summary, tmp_path / "b.summary.parquet", {"command": "bshared"})
    loaded = load_audit(tmp_path / "b.parquet").audit.per_seed
    assert list(loaded["boot_low"]) == [0.5, 0.6] and "ci_low" not in loaded


# 4 ---------------------------------------------------------------------------------------


def test_the_corrected_measures_carry_the_clipped_mass_and_warn_above_the_threshold() -> None:
    sets = _sets(np.random.default_rng(1))
    for names in (["B_shared_C_unbiased"], AUDITS["acg"].corrected):
        assert "gram_negative_mass" in corrected_measures(sets, names)
    frame = pd.concat([
        _per_seed({"m": [0.01, 0.08, 0.12]}, "gram_negative_mass"),
        _per_seed({"ok": [0.01, CLIPPED_MASS_WARN]}, "gram_negative_mass"),
    ])  # fmt: skip
    notes = clipped_mass_notes(frame)
    assert len(notes) == 1 and notes[0].startswith("m:") and "seed(s) 1, 2 (max 12.0%)" in notes[0]


def test_the_threshold_is_where_the_two_readings_of_a_clipped_gram_differ_by_5_6_percent() -> None:
    """noise.py: with a share m of |eigenvalue| mass negative, lambda_1 over the clipped
    trace and over the signed trace differ by (1 - m) / (1 - 2m)."""
    rng = np.random.default_rng(2)
    Q, _ = np.linalg.qr(rng.normal(size=(4, 4)))  # noqa: N806
    m = CLIPPED_MASS_WARN
    lam = np.array([0.6, 0.25, 0.15 - m, 0.0]) / 1.0
    lam[-1] = -m  # |lambda| sums to 1, a share m negative
    G = Q @ np.diag(lam) @ Q.T  # noqa: N806
    clipped, mass = psd_part(G)
    assert mass == pytest.approx(m)
    signed = lam.max() / lam.sum()
    assert signed / gram_measures(G)["B_shared"] == pytest.approx((1 - m) / (1 - 2 * m))
    assert (1 - m) / (1 - 2 * m) == pytest.approx(1.0556, abs=1e-4)


# 5 ---------------------------------------------------------------------------------------


def test_plain_and_corrected_are_never_shown_as_comparable() -> None:
    summary = pd.concat([
        _per_seed({"m": [0.7]}, "B_shared_C"), _per_seed({"m": [0.9]}, "B_shared_C_unbiased"),
        _per_seed({"m": [0.1]}, "gram_negative_mass"),
    ]).rename(columns={"value": "mean"}).assign(se=np.nan, n_seeds=1)  # fmt: skip
    assert NOT_COMPARABLE in audit_caption(summary, pd.DataFrame())
    plain_only = summary[summary["measure"] == "B_shared_C"]
    assert NOT_COMPARABLE not in audit_caption(plain_only, pd.DataFrame())
    text = audit_repr("bshared", "B_shared_C", {"summary": summary, "paired": pd.DataFrame()})
    assert "never compare it with the plain value" in text
    assert "B_shared_C_unbiased (clipped 10.00%)" in text  # the twin carries its clipped mass
    assert "not comparable" in AUDITS["bshared"].title


# 6 ---------------------------------------------------------------------------------------


def test_gradcheck_doc_names_the_default_estimator_the_settings_hold() -> None:
    text = (ROOT / "docs/gradcheck.md").read_text()
    called_default = set(re.findall(r"`(\w+)` \(default", text))
    called_default |= set(re.findall(r"\| (\w+) \(default\)", text))
    assert called_default == {DEFAULT_ESTIMATOR} and DEFAULT_ESTIMATOR in GRADIENT_ESTIMATORS
    assert re.search(rf'DEFAULT_ESTIMATOR = "{DEFAULT_ESTIMATOR}"', text)
