"""`cdscope eap-info` end to end (SPEC §6): outputs, verified answers only, length
filtering, and its bad inputs (exit 2, one line, nothing written). The estimator and its
slow twins are tested in test_eap.py."""

from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.core.eap import edge_count
from tests.helpers import byte_tokenizer, tiny_model

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _save(directory, model):
    model.save_pretrained(directory)
    byte_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def other_dirs(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.helpers import COMMON_CONFIG

    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(1)
    two_layers = LlamaForCausalLM(LlamaConfig(**{**COMMON_CONFIG, "num_hidden_layers": 2})).eval()
    return {
        "llama_b": _save(root / "llama_b", tiny_model("llama", "sdpa", seed=1)),
        "gpt2": _save(root / "gpt2", tiny_model("gpt2", "sdpa")),
        "llama_L2": _save(root / "llama_L2", two_layers),
    }


def _metadata(path):
    return json.loads(pq.read_schema(path).metadata[b"cdscope"])


def test_cli_with_targets_and_baseline_writes_everything(
    tiny_model_dir, other_dirs, pool_file, tmp_path
) -> None:
    out, plot = tmp_path / "r" / "eap.parquet", tmp_path / "r" / "eap.png"
    result = invoke(
        "eap-info",
        "--model",
        tiny_model_dir,
        "--baseline",
        other_dirs["llama_b"],
        "--probe",
        pool_file,
        "--family",
        "logic",
        "--n",
        3,
        "--use-targets",
        "--out",
        out,
        "--plot",
        plot,
        "--batch-size",
        2,
    )
    assert result.exit_code == 0, result.output
    frame = pd.read_parquet(out)
    assert list(frame.columns[:8]) == [
        "model",
        "sample_id",
        "family",
        "answer_source",
        "intensity",
        "info_complexity",
        "kurtosis",
        "n_tokens",
    ]
    assert len(frame) == 6 and set(frame["answer_source"]) == {"probe_target"}
    assert frame["info_complexity"].between(0, 1).all() and (frame["kurtosis"] >= 1).all()
    edges = pd.read_parquet(out.with_name("eap.edges.parquet"))
    assert len(edges) == 2 * edge_count(3)
    assert list(edges.columns) == [
        "model",
        "upstream",
        "downstream",
        "path",
        "mean_score",
        "mean_abs_score",
    ]
    meta = _metadata(out)
    assert meta["command"] == "eap-info" and meta["edges"] == edge_count(3)
    assert len(meta["summary"]) == 6 and len(meta["paired"]) == 3
    assert meta["counts"][str(tiny_model_dir)] == {
        "drawn": 3,
        "unsupported": 0,
        "incorrect": 0,
        "too_long": 0,
        "correct": 3,
    }
    assert plot.stat().st_size > 10_000
    assert "info_complexity" in result.output and "bootstrap 95% of Δ" in result.output


def test_cli_scores_verified_generations_only(tiny_model_dir, tmp_path, monkeypatch) -> None:
    """The wiring of generated answers: a stubbed generator answers item 0 right, item 1 wrong."""
    import cdscope.commands.eap_info as workflow

    pool = tmp_path / "g.jsonl"
    pool.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"math/{i}",
                    "family": "math",
                    "prompt": f"{i}+2=?\n",
                    "target": f"The answer is {i + 2}.",
                    "answer": str(i + 2),
                    "verifier": "math",
                }
            )
            + "\n"
            for i in range(2)
        )
    )
    replies = {"0": "0 + 2 = 2.\nThe answer is 2.\nnoise after", "1": "The answer is 9."}
    monkeypatch.setattr(
        workflow, "_generate", lambda lm, prompt, m: replies[lm.tokenizer.decode(prompt)[0]]
    )
    out = tmp_path / "g.parquet"
    result = invoke(
        "eap-info", "--model", tiny_model_dir, "--probe", pool, "--n", 2, "--out", out, "--json"
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)  # --json: summary rows and counts, one object
    assert payload["command"] == "eap-info" and payload["summary"]
    frame = pd.read_parquet(out)
    assert frame["sample_id"].tolist() == ["math/0"] and frame["answer_source"][0] == "generated"
    assert frame["n_tokens"][0] == len("0 + 2 = 2.\nThe answer is 2.")  # one token per character
    assert _metadata(out)["counts"][str(tiny_model_dir)]["incorrect"] == 1


def test_cli_counts_sequences_over_max_tokens(tiny_model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "m.parquet"
    result = invoke(
        "eap-info",
        "--model",
        tiny_model_dir,
        "--probe",
        pool_file,
        "--family",
        "math",
        "--n",
        5,
        "--use-targets",
        "--max-tokens",
        33,
        "--out",
        out,
    )
    assert result.exit_code == 0, result.output
    frame, counts = pd.read_parquet(out), _metadata(out)["counts"][str(tiny_model_dir)]
    assert 0 < counts["too_long"] < 5 and counts["correct"] == len(frame) == 5 - counts["too_long"]
    assert (frame["seq_tokens"] <= 33).all()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-new-tokens", 4], "no sample answered correctly"),  # a random model's answers
        (["--use-targets", "--max-tokens", 5], "no sample answered correctly"),
        (["--use-targets", "--baseline", "gpt2"], "edges would not align"),
        (["--use-targets", "--baseline", "llama_L2"], "edges would not align"),
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(
    extra, message, tiny_model_dir, other_dirs, tmp_path
) -> None:
    pool = tmp_path / "g.jsonl"
    pool.write_text(
        json.dumps(
            {
                "id": "math/0",
                "family": "math",
                "prompt": "What is 2 + 2?\n",
                "target": "The answer is 4.",
                "answer": "4",
                "verifier": "math",
            }
        )
    )
    extra = [other_dirs.get(x, x) for x in extra]
    out = tmp_path / "out" / "eap.parquet"
    result = invoke(
        "eap-info",
        "--model",
        tiny_model_dir,
        "--probe",
        pool,
        "--n",
        1,
        "--out",
        out,
        "--plot",
        tmp_path / "out" / "eap.png",
        *extra,
    )
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.parent.exists()  # not even an empty folder (the check removes what it made)
