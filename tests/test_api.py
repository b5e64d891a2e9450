"""The public Python API (cdscope/api.py) on tiny models: same numbers as the CLI,
DataFrames in the CLI's Parquet schemas, one-sentence CdscopeErrors for wrong inputs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import cdscope
from cdscope import CdscopeError
from cdscope.cli import app
from cdscope.core.probes import draw_probe as core_draw
from cdscope.core.probes import load_pool as core_load
from cdscope.output.frames import FRAME_COLUMNS, SAMPLE_COLUMNS
from tests.helpers import byte_tokenizer, tiny_model


@pytest.fixture(scope="module")
def in_memory():
    return cdscope.load_model(tiny_model("llama", seed=1), byte_tokenizer(), name="tiny-b")


def test_public_names_are_exported() -> None:
    assert set(cdscope.__all__) == set(cdscope._EXPORTS) | {"__version__"}
    for name in cdscope.__all__:
        assert getattr(cdscope, name) is not None
    assert {"load_model", "measure", "bshared", "compare", "plot"} <= set(cdscope.__all__)


def test_cli_and_api_give_identical_numbers(tiny_model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "b.parquet"
    cli = CliRunner().invoke(
        app,
        ["bshared", "--model", str(tiny_model_dir), "--probe", str(pool_file), "--seeds", "2",
         "--n", "2", "--out", str(out), "--json"],
    )  # fmt: skip
    assert cli.exit_code == 0, cli.output
    model = cdscope.load_model(tiny_model_dir, name=str(tiny_model_dir))
    frame = cdscope.measure(model, pool_file, seeds=2, n=2, progress=False)
    result = cdscope.bshared(frame)
    from_cli = cdscope.read_results(out)
    pd.testing.assert_frame_equal(result.per_seed, from_cli, check_exact=True)
    probe_file = cdscope.read_results(tmp_path / "b.probe.parquet")
    pd.testing.assert_frame_equal(frame[FRAME_COLUMNS], probe_file[FRAME_COLUMNS], check_exact=True)
    assert list(frame.columns) == FRAME_COLUMNS + SAMPLE_COLUMNS
    for column in SAMPLE_COLUMNS:  # per-sample lists: the same numbers, element by element
        for mine, theirs in zip(frame[column], probe_file[column], strict=True):
            assert np.array_equal(np.stack(list(mine)) if np.ndim(mine[0]) else np.asarray(mine),
                                  np.stack(list(theirs)) if np.ndim(theirs[0]) else np.asarray(theirs))  # fmt: skip
    summary = json.loads(cli.stdout)["summary"]
    api_summary = result.summary.to_dict(orient="records")
    assert summary == json.loads(json.dumps(api_summary, default=float))
    record = frame.attrs["cdscope"]["models"][0]
    assert record["revision"].startswith("sha256:") and record["K"] == 6


def test_objects_loaded_by_hand_measure_like_a_directory(tiny_model_dir, pool_file) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    by_hand = cdscope.load_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
        name="m",
    )
    by_path = cdscope.load_model(tiny_model_dir, name="m")
    a = cdscope.measure(by_hand, pool_file, n=2, progress=False)
    b = cdscope.measure(by_path, pool_file, n=2, progress=False)
    np.testing.assert_allclose(a["C"], b["C"], rtol=1e-5, atol=1e-7)
    assert by_hand.revision == "in-memory" and by_hand.dtype == by_path.dtype


def test_compare_pairs_seeds_against_the_chosen_reference(
    tiny_model_dir, in_memory, pool_file
) -> None:
    frame = cdscope.measure(
        [cdscope.load_model(tiny_model_dir, name="tiny-a"), in_memory], pool_file, seeds=3,
        n=2, progress=False,
    )  # fmt: skip
    paired = cdscope.compare(frame)
    row = paired[paired["measure"] == "B_shared_C"].iloc[0]
    wide = (
        cdscope.bshared(frame)
        .per_seed.pivot_table(index=["measure", "seed"], columns="model", values="value")
        .loc["B_shared_C"]
    )
    diff = wide["tiny-b"] - wide["tiny-a"]  # the slow obvious twin
    assert row["model"] == "tiny-b" and row["reference"] == "tiny-a" and row["n"] == 3
    assert row["mean"] == pytest.approx(diff.mean())
    assert row["se"] == pytest.approx(diff.std(ddof=1) / np.sqrt(3))
    flipped = cdscope.compare(frame, reference="tiny-b")
    row_b = flipped[flipped["measure"] == "B_shared_C"].iloc[0]
    assert row_b["reference"] == "tiny-b" and row_b["mean"] == pytest.approx(-diff.mean())
    decomposed = cdscope.compare(frame, audit="decompose")
    assert "B_dir" in set(decomposed["measure"])


def test_probe_sources_are_interchangeable(pool_file) -> None:
    records = [json.loads(line) for line in pool_file.read_text().splitlines()]
    from_file = cdscope.load_pool(pool_file)
    for source in (records, pd.DataFrame(records), [str(pool_file)]):
        assert cdscope.load_pool(source).hash == from_file.hash
    drawn = cdscope.draw_probe(pd.DataFrame(records), seed=4, n=2)
    assert list(drawn["id"]) == [it.id for it in core_draw(core_load([pool_file]), 4, 2)]
    shipped = cdscope.draw_probe(seed=0, n=1)
    assert sorted(shipped["family"]) == ["code", "logic", "math"]


def test_random_reference_takes_k_from_a_model(in_memory, tmp_path) -> None:
    ref = cdscope.random_reference(3, model=in_memory, trials=500, value=0.6)
    assert ref.stats["K"] == 6 and len(ref.frame) == 500
    assert ref.stats["percentile"] == pytest.approx(100 * np.mean(ref.frame["B_shared"] <= 0.6))
    cdscope.plot(ref, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0


def test_random_reference_counts_the_gates_a_measurement_has() -> None:
    """K of a model is its discovered gate count, not 2 x layers: falcon_h1's blocks have
    three writes (mixer, attention and MLP in parallel), so 2 layers give K = 6, as
    ``measure`` counts them (before issue #30 the API said 2 x layers = 4)."""
    from cdscope.tools.tiny import tiny_model as tiny_of_type

    loaded = cdscope.load_model(tiny_of_type("falcon_h1"), byte_tokenizer(), name="hybrid")
    ref = cdscope.random_reference(3, model=loaded, trials=100)
    frame = cdscope.measure(loaded, n=1, progress=False)
    assert ref.stats["K"] == frame["gate"].nunique() == 6 != 2 * loaded.num_layers


def test_plot_writes_the_cli_figure(in_memory, pool_file, tmp_path) -> None:
    result = cdscope.acg(in_memory, probe=pool_file, n=2, progress=False)
    assert set(result.summary["measure"]) == {
        "ACG",
        "B_shared_C",
        "B_shared_F",
        "B_shared_C_unbiased",
        "gram_negative_mass",  # the corrected measure never comes without it (issue 36)
    }
    cdscope.plot(result, tmp_path / "a.svg")
    assert (tmp_path / "a.svg").read_text().startswith("<?xml")
    with pytest.raises(CdscopeError, match=r"plot must end in \.png"):
        cdscope.plot(result, tmp_path / "a.txt")


def _one_sentence(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_wrong_inputs_raise_one_sentence(tiny_model_dir, in_memory, pool_file) -> None:
    from transformers import AutoTokenizer

    big = AutoTokenizer.from_pretrained(tiny_model_dir)
    big.add_tokens([f"<extra{i}>" for i in range(100)])
    with pytest.raises(CdscopeError, match="do not belong together") as exc:
        cdscope.load_model(tiny_model("llama"), big)
    _one_sentence(exc)
    with pytest.raises(CdscopeError, match="needs its tokenizer"):
        cdscope.load_model(tiny_model("llama"))
    with pytest.raises(CdscopeError, match="model must be a hub id"):
        cdscope.load_model(42)
    with pytest.raises(CdscopeError, match="tokenizer= goes with a model object"):
        cdscope.load_model(tiny_model_dir, byte_tokenizer())
    no_target = [{"id": "a/1", "family": "a", "prompt": "p"}]
    with pytest.raises(CdscopeError, match=r"probe\[0\]: missing key\(s\) target") as exc:
        cdscope.measure(in_memory, no_target)
    _one_sentence(exc)
    with pytest.raises(CdscopeError, match=r"lacks column\(s\) target"):
        cdscope.load_pool(pd.DataFrame(no_target))
    frame = cdscope.measure(in_memory, pool_file, n=2, progress=False)
    with pytest.raises(CdscopeError, match=r"missing column\(s\) C, F") as exc:
        cdscope.bshared(frame.drop(columns=["C", "F"]))
    _one_sentence(exc)
    with pytest.raises(CdscopeError, match="apply when measuring a model"):
        cdscope.bshared(frame, seeds=3)
    with pytest.raises(CdscopeError, match="at least two models"):
        cdscope.compare(frame)
    with pytest.raises(CdscopeError, match="probe must be None"):
        cdscope.load_pool(3.5)
