"""Noise-aware audit outputs end to end on tiny local models: per-sample probe columns,
the corrected measures, bootstrap intervals, seeds needed, the direction check, nsweep."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cdscope.analysis.stats import seeds_needed
from cdscope.analysis.uncertainty import corrected_measures
from cdscope.output.frames import SAMPLE_COLUMNS, sample_sets
from tests.helpers import invoke, write_pool


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return write_pool(
        tmp_path_factory.mktemp("pool") / "pool.jsonl", {"math": 6, "code": 6, "logic": 6}
    )


@pytest.fixture(scope="module")
def measured(two_models, pool, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("noise") / "b.parquet"
    base, other = two_models
    result = invoke(
        "bshared", "-m", base, "-m", other, "-p", pool, "--seeds", 3, "--n", 4, "-o", out,
        "--bootstrap", 200, "--detect", 2, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout.strip().splitlines()[-1])


def test_probe_file_carries_per_sample_columns_that_average_to_the_family_values(measured) -> None:
    out, _ = measured
    probe = pd.read_parquet(out.with_name("b.probe.parquet"))
    assert set(SAMPLE_COLUMNS) <= set(probe.columns)
    for row in probe.sample(20, random_state=0).itertuples():
        assert len(row.dlogp_samples) == 4
        assert np.mean(row.dlogp_samples) == pytest.approx(row.dl_dg, rel=1e-6, abs=1e-9)
        assert np.mean(row.logp_samples) == pytest.approx(row.ell, rel=1e-9)
        assert np.mean(row.F_samples) == pytest.approx(row.F, rel=1e-6)


def test_bshared_json_has_corrected_measures_intervals_and_seeds_needed(measured) -> None:
    out, payload = measured
    per_seed = pd.DataFrame(payload["per_seed"])
    probe = pd.read_parquet(out.with_name("b.probe.parquet"))
    for (model, seed), (_, sets) in sample_sets(probe).items():
        rows = per_seed[(per_seed["model"] == model) & (per_seed["seed"] == seed)].set_index(
            "measure"
        )
        expected = corrected_measures(sets)
        assert rows.loc["B_shared_C_unbiased", "value"] == pytest.approx(
            expected["B_shared_C_unbiased"]
        )
        for measure in ("B_shared_C", "R_C", "B_shared_C_unbiased", "R_C_unbiased"):
            lo, hi = rows.loc[measure, "boot_low"], rows.loc[measure, "boot_high"]
            assert np.isfinite(lo) and lo < hi
    paired = pd.DataFrame(payload["paired"]).set_index("measure")
    wide = per_seed[per_seed["measure"] == "B_shared_C"].pivot(
        index="seed", columns="model", values="value"
    )
    deltas = wide[payload["models"][1]] - wide[payload["models"][0]]
    assert paired.loc["B_shared_C", "sd"] == pytest.approx(np.std(deltas, ddof=1))
    assert paired.loc["B_shared_C", "seeds_needed"] == seeds_needed(0.02, np.std(deltas, ddof=1))
    assert payload["detect"] == 0.02 and payload["bootstrap"] == 200
    convergence = pd.DataFrame(payload["convergence"])
    assert len(convergence) == 6 and (convergence["angle_deg"] >= 0).all()
    assert (convergence["angle_deg"] <= convergence["dk_bound_deg"] + 1e-9).all()
    assert out.with_name("b.convergence.parquet").is_file()


def test_plain_numbers_do_not_change_and_old_probe_files_stay_readable(measured, tmp_path) -> None:
    out, payload = measured
    probe = pd.read_parquet(out.with_name("b.probe.parquet"))
    from cdscope.io import read_parquet, write_parquet

    _, meta = read_parquet(out.with_name("b.probe.parquet"))
    old = tmp_path / "old.probe.parquet"
    write_parquet(probe.drop(columns=SAMPLE_COLUMNS), old, meta)
    result = invoke("bshared", "--from", old, "-o", tmp_path / "o.parquet", "--json")
    assert result.exit_code == 0, result.output
    assert "per-sample columns absent" in result.stderr
    again = pd.DataFrame(json.loads(result.stdout.strip().splitlines()[-1])["per_seed"])
    assert "B_shared_C_unbiased" not in set(again["measure"])
    assert again["boot_low"].isna().all()
    first = pd.DataFrame(payload["per_seed"])
    plain = first[first["measure"].isin(["B_shared_C", "R_C"])].reset_index(drop=True)
    np.testing.assert_allclose(again["value"], plain["value"], rtol=1e-12)


def test_bad_bootstrap_and_detect_are_refused(tmp_path) -> None:
    for args, message in ((("--bootstrap", -1), "--bootstrap"), (("--detect", 0), "--detect")):
        result = invoke(
            "bshared", "--from", tmp_path / "x.parquet", *args, "-o", tmp_path / "o.parquet"
        )
        assert result.exit_code == 2 and message in result.stderr


def test_nsweep_from_a_probe_file_and_its_plot(measured, tmp_path) -> None:
    out, payload = measured
    target, plot = tmp_path / "ns.parquet", tmp_path / "ns.png"
    result = invoke(
        "nsweep", "--from", out.with_name("b.probe.parquet"), "--ns", "1,2,4", "-o", target,
        "--plot", plot, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    sweep = pd.read_parquet(target)
    assert set(sweep["n"]) == {1, 2, 4}
    assert set(sweep[sweep["n"] == 1]["measure"]) == {"B_shared_C"}  # corrected needs n >= 2
    # at n = n_max the subset is the whole probe: the values are bshared's
    first = pd.DataFrame(payload["per_seed"])
    for measure in ("B_shared_C", "B_shared_C_unbiased"):
        a = sweep[(sweep["n"] == 4) & (sweep["measure"] == measure)].sort_values(["model", "seed"])
        b = first[first["measure"] == measure].sort_values(["model", "seed"])
        np.testing.assert_allclose(a["value"].to_numpy(), b["value"].to_numpy(), rtol=1e-9)
    assert plot.stat().st_size > 10_000
    too_many = invoke("nsweep", "--from", out.with_name("b.probe.parquet"), "--ns", "2,8",
                      "-o", tmp_path / "x.parquet")  # fmt: skip
    assert too_many.exit_code == 2 and "n >= 8" in too_many.stderr
