"""bshared / acg / decompose / random-ref end to end on tiny local models, and their bad inputs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from cdscope.analysis import spectral
from cdscope.analysis.stats import paired_difference
from cdscope.output.frames import control_matrices
from tests.helpers import COMMON_CONFIG, byte_tokenizer, invoke, write_pool


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    return write_pool(
        tmp_path_factory.mktemp("pool") / "pool.jsonl", {"math": 6, "code": 6, "logic": 6}
    )


def test_bshared_two_models_per_seed_paired_and_plot(two_models, pool, tmp_path) -> None:
    out, plot = tmp_path / "b.parquet", tmp_path / "b.png"
    base, other = two_models
    result = invoke(
        "bshared",
        "-m",
        base,
        "-m",
        other,
        "-p",
        pool,
        "--seeds",
        3,
        "--n",
        2,
        "-o",
        out,
        "--plot",
        plot,
        "--json",
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    per_seed = pd.read_parquet(out)
    probe = pd.read_parquet(tmp_path / "b.probe.parquet")
    # per-seed B_shared equals spectral.b_shared of the probe file's C (kept rows)
    matrices = control_matrices(probe, "C")
    for (model, seed), (_, C) in matrices.items():  # noqa: N806
        rows = per_seed[(per_seed["model"] == model) & (per_seed["seed"] == seed)]
        value = rows[rows["measure"] == "B_shared_C"]["value"].item()
        assert value == pytest.approx(spectral.b_shared(C))
    # paired deltas = other - base on the same seeds
    wide = per_seed[per_seed["measure"] == "B_shared_C"].pivot(
        index="seed", columns="model", values="value"
    )
    expected = paired_difference(wide[str(other)], wide[str(base)])
    row = next(r for r in payload["paired"] if r["measure"] == "B_shared_C")
    assert row["mean"] == pytest.approx(expected.mean) and row["n"] == 3
    assert (
        row["ci_low"] == pytest.approx(expected.ci_low) and row["n_negative"] == expected.n_negative
    )
    summary = pd.read_parquet(tmp_path / "b.summary.parquet")
    assert set(summary["kind"]) == {"mean", "paired"}
    assert plot.stat().st_size > 10_000


def test_bshared_from_reuses_the_probe_file_without_a_model(two_models, pool, tmp_path) -> None:
    out = tmp_path / "b.parquet"
    assert (
        invoke(
            "bshared", "-m", two_models[0], "-p", pool, "--seeds", 2, "--n", 2, "-o", out
        ).exit_code
        == 0
    )
    again = invoke(
        "bshared", "--from", tmp_path / "b.probe.parquet", "-o", tmp_path / "again.parquet"
    )
    assert again.exit_code == 0, again.output
    pd.testing.assert_frame_equal(pd.read_parquet(out), pd.read_parquet(tmp_path / "again.parquet"))
    wrong = invoke(
        "bshared", "--from", tmp_path / "b.probe.parquet", "--n", 3, "-o", tmp_path / "x.parquet"
    )
    assert wrong.exit_code == 2 and "measured with n=2" in wrong.output
    finer = invoke(
        "bshared", "--from", tmp_path / "b.probe.parquet", "--granularity", "head",
        "-o", tmp_path / "h.parquet",
    )  # fmt: skip
    assert finer.exit_code == 2, finer.output
    assert "measured with granularity='sublayer' but --granularity head" in finer.output
    assert not (tmp_path / "h.parquet").exists()
    schema = invoke("bshared", "--from", out, "-o", tmp_path / "y.parquet")
    assert schema.exit_code == 2 and "not a probe file" in schema.output


def test_fail_above_is_a_ci_gate(two_models, pool, tmp_path) -> None:
    args = ("bshared", "-m", two_models[0], "-p", pool, "--n", 2, "-o", tmp_path / "b.parquet")
    assert invoke(*args, "--fail-above", 100).exit_code == 0
    failed = invoke(*args, "--fail-above", 1)
    assert failed.exit_code == 1 and "audit failed" in failed.output
    assert (tmp_path / "b.parquet").exists()  # results are written before the gate fires


def test_acg_and_decompose(two_models, pool, tmp_path) -> None:
    result = invoke(
        "acg",
        "-m",
        two_models[0],
        "-m",
        two_models[1],
        "-p",
        pool,
        "--seeds",
        2,
        "--n",
        2,
        "-o",
        tmp_path / "a.parquet",
        "--plot",
        tmp_path / "a.png",
    )
    assert result.exit_code == 0, result.output
    acg = pd.read_parquet(tmp_path / "a.parquet").pivot_table(
        index=["model", "seed"], columns="measure", values="value"
    )
    np.testing.assert_allclose(acg["ACG"], acg["B_shared_F"] - acg["B_shared_C"])
    result = invoke(
        "decompose",
        "--from",
        tmp_path / "a.probe.parquet",
        "-o",
        tmp_path / "d.parquet",
        "--plot",
        tmp_path / "d.png",
    )
    assert result.exit_code == 0, result.output
    assert (
        "abs_cos[code|logic]" in result.output and "PR[math]" in result.output
    )  # not eaten as markup
    dec = pd.read_parquet(tmp_path / "d.parquet")
    assert {"B_dir", "B_norm", "abs_cos", "PR", "top1%"} <= set(dec["measure"])
    pair = dec[(dec["measure"] == "abs_cos") & (dec["family"] == "code")]
    assert set(pair["family_b"]) == {"logic", "math"}  # tidy: the pair in two columns
    assert set(dec.loc[dec["measure"] == "PR", "value_unit"]) == {"gates"}
    assert (tmp_path / "d.png").stat().st_size > 10_000


def test_models_with_different_K_refuse_only_K_dependent_deltas(two_models, pool, tmp_path) -> None:
    deeper = tmp_path / "deeper"
    LlamaForCausalLM(LlamaConfig(**{**COMMON_CONFIG, "num_hidden_layers": 4})).save_pretrained(
        deeper
    )  # K = 8, not 6
    byte_tokenizer().save_pretrained(deeper)
    result = invoke(
        "decompose",
        "-m",
        two_models[0],
        "-m",
        deeper,
        "-p",
        pool,
        "--n",
        2,
        "-o",
        tmp_path / "d.parquet",
        "--json",
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    measures = {r["measure"] for r in payload["paired"]}
    assert "B_shared_C" in measures and not measures & {"PR", "top1%"}
    assert payload["refused_pairs"]


def test_single_family_is_refused(two_models, tmp_path) -> None:
    one = write_pool(tmp_path / "one.jsonl", {"math": 5})
    result = invoke("bshared", "-m", two_models[0], "-p", one, "-o", tmp_path / "b.parquet")
    assert result.exit_code == 2 and "at least 2 task families" in result.output
    assert not (tmp_path / "b.parquet").exists()


def test_random_ref_statistics_and_percentile(tmp_path) -> None:
    out = tmp_path / "r.parquet"
    result = invoke(
        "random-ref",
        "-M",
        3,
        "-K",
        56,
        "-T",
        20000,
        "--seed",
        1,
        "--value",
        45,
        "--json",
        "-o",
        out,
        "--plot",
        tmp_path / "r.png",
    )
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout.strip().splitlines()[0])
    samples = pd.read_parquet(out)["B_shared"].to_numpy()
    assert len(samples) == 20000
    assert stats["mean"] == pytest.approx(samples.mean()) and stats["p99"] == pytest.approx(
        np.percentile(samples, 99)
    )
    assert stats["percentile"] == pytest.approx(100 * np.mean(samples <= 0.45))
    assert 0.40 < stats["mean"] < 0.46


def test_random_ref_takes_K_from_a_model(tiny_model_dir, tmp_path) -> None:
    result = invoke(
        "random-ref", "--model", tiny_model_dir, "-T", 100, "--json", "-o", tmp_path / "r.parquet"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[0])["K"] == 6


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-M", 3, "-K", 56, "--trials", 0), "--trials must be at least 1"),
        (("-M", 1, "-K", 56), "--families must be at least 2"),
        (("-M", 3), "give --gates K"),
        (("-M", 3, "-K", 5, "--value", 140), "--value is a percentage"),
        (("-M", 3, "-K", 5, "--plot", "x.gif"), "--plot must end in"),
    ],
)
def test_random_ref_bad_inputs(tmp_path, args, message) -> None:
    out = tmp_path / "r.parquet"
    result = invoke("random-ref", *args, "-o", out)
    assert result.exit_code == 2 and message in result.output
    assert not out.exists()


def test_unwritable_out_is_refused(tmp_path) -> None:
    (tmp_path / "f").write_text("x")
    result = invoke("random-ref", "-M", 3, "-K", 5, "-o", tmp_path / "f" / "r.parquet")
    assert result.exit_code == 2 and "cannot write" in result.output


def test_bshared_resume_keeps_finished_seeds(two_models, pool, tmp_path) -> None:
    out = tmp_path / "b.parquet"
    args = ("bshared", "-m", two_models[0], "-p", pool, "--n", 2, "-o", out)
    assert invoke(*args, "--seeds", 1).exit_code == 0
    resumed = invoke(*args, "--seeds", 2, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "keeping 1 finished" in resumed.output
    assert sorted(pd.read_parquet(out)["seed"].unique()) == [0, 1]
    refused = invoke(
        "bshared", "--from", tmp_path / "b.probe.parquet", "--resume", "-o", tmp_path / "c.parquet"
    )
    assert refused.exit_code == 2 and "does not apply to --from" in refused.output
