"""The first hour's papercuts (issue #40, item 6), each as a careless user meets it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import cdscope
from cdscope.io import read_parquet
from tests.helpers import invoke, refused
from tests.test_faults import probe_file


# -- print(model) and the loading bar ----------------------------------------------------------
def test_a_loaded_model_prints_as_one_line(tiny_model_dir) -> None:
    model = cdscope.load_model(tiny_model_dir, name="tiny")
    shown = repr(model)
    assert "\n" not in shown and len(shown) < 300, shown  # not the ~60-line module tree
    assert shown.startswith("LoadedModel(name='tiny', LlamaForCausalLM, ")
    count = sum(p.numel() for p in model.model.parameters())
    assert f"{count:,} parameters" in shown and "float32 on cpu" in shown
    assert f"revision={model.revision!r}" in shown


def test_load_model_shows_no_loading_bar_and_leaves_the_bars_as_it_found_them(
    tiny_model_dir, capfd
) -> None:
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    capfd.readouterr()
    cdscope.load_model(tiny_model_dir)
    assert "Loading weights" not in capfd.readouterr().err  # transformers' bar, as the CLI
    assert hf_logging.is_progress_bar_enabled() and not hub.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # a user's choice to have none stays theirs
    cdscope.load_model(tiny_model_dir)
    assert not hf_logging.is_progress_bar_enabled() and hub.are_progress_bars_disabled()
    hf_logging.enable_progress_bar()


# -- -o x.csv ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args",
    [
        ["probe", "--out", "{d}/x.csv"],
        ["bshared", "--out", "{d}/x.json"],
        ["nsweep", "--out", "{d}/x.CSV"],
        ["random-ref", "-M", "3", "-K", "4", "--out", "{d}/x.xlsx"],
        ["gradcheck", "--out", "{d}/x.txt"],
        ["eap-info", "--out", "{d}/x.feather"],
    ],
)
def test_an_output_named_as_another_format_is_refused(tmp_path, args) -> None:
    """It used to write Parquet into x.csv without a word."""
    given = [a.replace("{d}", str(tmp_path)) for a in args]
    line = refused(invoke(*given), "cdscope writes Parquet, not ", "x.parquet")
    assert line.startswith(f"error: --out {given[-1]}")
    assert list(tmp_path.iterdir()) == []


# -- --resume with fewer seeds -----------------------------------------------------------------
def test_resume_with_fewer_seeds_reports_the_seeds_asked_for(tiny_model_dir, pool_file, tmp_path):
    out = tmp_path / "p.parquet"
    common = ["probe", "-m", tiny_model_dir, "-p", pool_file, "--n", 2, "--out", out]
    assert invoke(*common, "--seeds", 3).exit_code == 0
    three = read_parquet(out)[0]
    again = invoke(*common, "--seeds", 1, "--resume")
    assert again.exit_code == 0, again.output
    assert "keeping 1 finished (model, seed) pair(s)" in again.output  # was: 3
    assert "seed(s) 1, 2 are not asked for and are left out" in again.output
    frame, meta = read_parquet(out)
    assert set(frame["seed"]) == {0} and meta["seeds"] == "0..0"
    pd.testing.assert_frame_equal(  # seed 0 kept as it was, not measured again
        frame.reset_index(drop=True), three[three["seed"] == 0].reset_index(drop=True)
    )


# -- values as typed ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "typed"),
    [
        (["random-ref", "-M", "3", "-K", "4", "--value", "1e400"], "1e400 is not a finite number"),
        (["random-ref", "-M", "3", "-K", "4", "--value", "1e-400"], "1e-400 is too small"),
        (["train", "--lr", "1e400"], "1e400 is not a finite number"),
        (["train", "--tau", "-1e400"], "-1e400 is not a finite number"),
        (["eval", "--top-p", "2.50"], "2.50 is outside (0, 1]"),
        (["gradcheck", "--eps", "0.01,1e400"], "1e400 is not a finite number"),
    ],
)
def test_values_are_echoed_as_typed(tmp_path, args, typed) -> None:
    line = refused(invoke(*args, "-o", tmp_path / "o.parquet"), typed)
    assert "inf" not in line.replace("finite", "").replace("info", ""), line


# -- train -m, bshared --from one family, inspect --json ----------------------------------------
def test_train_takes_m_as_every_model_command_does(tmp_path) -> None:
    missing = tmp_path / "no" / "model"
    refused(invoke("train", "-m", missing, "-o", tmp_path / "run"), f"{missing}")


def test_a_probe_file_of_one_family_is_said_once(tmp_path) -> None:
    source = probe_file(tmp_path / "one.parquet", families=("math",), seeds=(0, 1, 2))
    result = invoke("bshared", "--from", source, "--out", tmp_path / "b.parquet")
    line = refused(result, "has one family (math)")
    assert "needs at least 2 families" in line
    assert "warning" not in result.output  # was: one warning per seed, then a vaguer error
    with pytest.raises(cdscope.CdscopeError, match=r"has one family \(math\)"):
        cdscope.bshared(read_parquet(source)[0])


def test_inspect_json_carries_the_command_key(tiny_model_dir) -> None:
    result = invoke("inspect", "-m", tiny_model_dir, "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["command"] == "inspect" and payload["K"] == 6
