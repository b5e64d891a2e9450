"""`cdscope probe` end to end on a tiny local model, and its bad inputs (exit 2, one line, no file)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.probes import draw_probe, drawn_ids, load_pool
from tests.helpers import byte_tokenizer, tiny_model, write_pool

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def test_probe_writes_long_format_parquet_with_metadata(
    tiny_model_dir, pool_file, tmp_path
) -> None:
    out = tmp_path / "res" / "probe.parquet"
    result = invoke(
        "probe",
        "--model",
        tiny_model_dir,
        "--probe",
        pool_file,
        "--seeds",
        2,
        "--n",
        2,
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out)
    assert list(frame.columns) == [
        "model",
        "seed",
        "family",
        "gate",
        "layer",
        "sublayer",
        "unit",
        "C",
        "F",
        "dl_dg",
        "ell",
        "dropped",
        "logp_samples",
        "dlogp_samples",
        "F_samples",
    ]
    K = 6  # noqa: N806 - 3 layers x (attn, mlp)
    assert len(frame) == 2 * 3 * K
    assert set(frame["sublayer"]) == {"attn", "mlp"}
    assert (frame["layer"] == frame["gate"] // 2).all()
    np.testing.assert_allclose(frame["C"], frame["dl_dg"] / frame["ell"])
    meta = json.loads(pq.read_schema(out).metadata[b"cdscope"])
    assert meta["seeds"] == "0..1" and meta["settings"]["n"] == 2
    assert meta["models"][0]["K"] == K and meta["models"][0]["revision"].startswith("sha256:")
    assert meta["probe_hash"].startswith("sha256:")
    pool = load_pool([pool_file])
    for seed in (0, 1):  # which items each (seed, family) drew, not only the pool hash
        assert meta["drawn"][str(seed)] == drawn_ids(draw_probe(pool, seed, 2))
    assert sorted(meta["drawn"]["0"]) == ["code", "logic", "math"]
    assert "B_shared C" in result.output and "tiny-llama" in result.output


def test_resume_skips_finished_seeds(tiny_model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "probe.parquet"
    assert (
        invoke(
            "probe", "-m", tiny_model_dir, "-p", pool_file, "--seeds", 1, "--n", 2, "-o", out
        ).exit_code
        == 0
    )
    first = pd.read_parquet(out)
    result = invoke(
        "probe",
        "-m",
        tiny_model_dir,
        "-p",
        pool_file,
        "--seeds",
        2,
        "--n",
        2,
        "-o",
        out,
        "--resume",
    )
    assert result.exit_code == 0, result.output
    assert "keeping 1 finished" in result.output
    both = pd.read_parquet(out)
    pd.testing.assert_frame_equal(both[both["seed"] == 0].reset_index(drop=True), first)
    assert sorted(both["seed"].unique()) == [0, 1]
    assert sorted(json.loads(pq.read_schema(out).metadata[b"cdscope"])["drawn"]) == ["0", "1"]
    refused = invoke(
        "probe",
        "-m",
        tiny_model_dir,
        "-p",
        pool_file,
        "--seeds",
        2,
        "--n",
        3,
        "-o",
        out,
        "--resume",
    )
    assert refused.exit_code == 2 and "different settings" in refused.output


def test_fd_estimator_agrees_with_autograd_through_the_cli(
    tiny_model_dir, pool_file, tmp_path
) -> None:
    for estimator in ("autograd", "fd"):
        args = (
            "probe",
            "-m",
            tiny_model_dir,
            "-p",
            pool_file,
            "--n",
            2,
            "--dtype",
            "float64",
            "--estimator",
            estimator,
            "-o",
            tmp_path / f"{estimator}.parquet",
        )
        assert invoke(*args).exit_code == 0
    a, f = (pd.read_parquet(tmp_path / f"{e}.parquet")["C"].to_numpy() for e in ("autograd", "fd"))
    assert np.linalg.norm(a - f) / np.linalg.norm(f) < 1e-3


def _assert_clean_failure(result, message: str, out) -> None:
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert not out.exists()
    assert not list(out.parent.glob(".*tmp")) if out.parent.exists() else True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "/nonexistent/model-dir"), "model path not found"),
        (("--probe", "/nonexistent/pool.jsonl"), "probe file not found"),
        (("--n", "9"), "fewer than --n 9"),
        (("--template", "chat"), "no chat template"),
        (("--estimator", "magic"), "--estimator must be one of"),
        (("--dtype", "int8"), "--dtype must be one of"),
    ],
)
def test_bad_inputs_fail_cleanly(tiny_model_dir, pool_file, tmp_path, args, message) -> None:
    out = tmp_path / "out.parquet"
    base = {"--model": str(tiny_model_dir), "--probe": str(pool_file)}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [x for kv in base.items() for x in kv]
    _assert_clean_failure(invoke("probe", *flat, "--out", out), message, out)


def test_malformed_probe_line_is_named(tiny_model_dir, tmp_path) -> None:
    pool = write_pool(tmp_path / "pool.jsonl", {"a": 3, "b": 3})
    pool.write_text(pool.read_text() + "{broken\n")
    out = tmp_path / "out.parquet"
    _assert_clean_failure(
        invoke("probe", "-m", tiny_model_dir, "-p", pool, "-o", out),
        "pool.jsonl:7: not valid JSON",
        out,
    )


def test_unwritable_out_is_refused_before_any_work(tiny_model_dir, pool_file, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke(
        "probe", "-m", tiny_model_dir, "-p", pool_file, "-o", blocker / "sub" / "out.parquet"
    )
    assert result.exit_code == 2 and "cannot write" in result.output


def test_non_finite_values_name_model_seed_and_family(pool_file, tmp_path) -> None:
    directory = tmp_path / "nan-model"
    model = tiny_model("llama")
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.fill_(float("nan"))
    model.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    out = tmp_path / "out.parquet"
    result = invoke("probe", "-m", directory, "-p", pool_file, "--n", 2, "-o", out)
    assert result.exit_code == 2  # refused at load: the proof of the gates needs finite states
    assert "layer 1: non-finite hidden states" in result.output
    assert not out.exists()


def test_hub_id_that_cannot_be_reached_is_one_line(monkeypatch, pool_file, tmp_path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "out.parquet"
    result = invoke("probe", "-m", "no-such-org/no-such-model", "-p", pool_file, "-o", out)
    _assert_clean_failure(result, "cannot load model 'no-such-org/no-such-model'", out)


def test_help_lists_every_option() -> None:
    result = invoke("probe", "--help")
    assert result.exit_code == 0
    for option in (
        "--model",
        "--seeds",
        "--n",
        "--probe",
        "--template",
        "--out",
        "--estimator",
        "--resume",
    ):
        assert option in result.output
