"""--resume keyed on everything that decides a number (issue #26): model files by content
(tokenizer and chat template included, the path excluded), probe and task files by
content, settings and kernels refused, thread count and library versions recorded and
warned about, unsound rows never reused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cdscope import io as cio
from cdscope.cli import app
from cdscope.core.models import loading
from cdscope.errors import CdscopeError
from tests.helpers import (
    byte_tokenizer,
    config,
    parity_reward,
    refused,
    tiny_model,
    write_tasks_file,
)

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def swap_tokens(model_dir: Path, a: str = "a", b: str = "e") -> None:
    """Edit tokenizer.json in place: two characters trade token ids (other numbers, same
    weights and config)."""
    path = model_dir / "tokenizer.json"
    spec = json.loads(path.read_text())
    vocab = spec["model"]["vocab"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(spec))


@pytest.fixture
def model_dir(tiny_model_dir, tmp_path) -> Path:
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "models" / "base"))


# -- the model's identity -------------------------------------------------------------------
def test_model_identity_is_the_content_of_every_file_that_decides_a_number(model_dir) -> None:
    revision = lambda: loading.model_source(str(model_dir))[1]  # noqa: E731
    first = revision()
    moved = Path(shutil.copytree(model_dir, model_dir.parent / "elsewhere"))
    assert loading.model_source(str(moved))[1] == first  # the path is not identity
    (model_dir / "README.md").write_text("# notes\n")
    assert revision() == first  # documentation decides nothing
    swap_tokens(model_dir)
    edited = revision()
    assert edited != first  # today: tokenizer files are skipped
    (model_dir / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert revision() not in (first, edited)
    with_template = revision()
    config = json.loads((model_dir / "generation_config.json").read_text())
    (model_dir / "generation_config.json").write_text(json.dumps({**config, "top_k": 3}))
    assert revision() not in (first, edited, with_template)
    names = [p.name for p in loading.identity_files(model_dir)]
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json", "chat_template.jinja"} <= set(names)  # fmt: skip
    assert "README.md" not in names


def test_model_hashes_are_memoised_per_file(model_dir, monkeypatch) -> None:
    loading.model_source(str(model_dir))
    opened = []
    real_open = open

    def counting(path, *args, **kwargs):
        opened.append(Path(path).name)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", counting)
    loading.model_source(str(model_dir))  # nothing changed: no file read again
    assert "model.safetensors" not in opened
    swap_tokens(model_dir)
    loading.model_source(str(model_dir))
    assert opened.count("tokenizer.json") == 1 and "model.safetensors" not in opened


def test_an_edited_tokenizer_is_never_resumed_silently(model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "p.parquet"
    args = ("probe", "-m", model_dir, "-p", pool_file, "--n", 2, "-o", out)
    assert invoke(*args, "--seeds", 1).exit_code == 0
    swap_tokens(model_dir)
    refused(invoke(*args, "--seeds", 2, "--resume"), "revision changed", "--resume=recompute")
    assert invoke(*args, "--seeds", 2, "--resume=recompute").exit_code == 0
    fresh = tmp_path / "fresh.parquet"
    assert invoke("probe", "-m", model_dir, "-p", pool_file, "--n", 2, "--seeds", 2,
                  "-o", fresh).exit_code == 0  # fmt: skip
    pd.testing.assert_frame_equal(pd.read_parquet(out), pd.read_parquet(fresh))


def test_the_same_model_by_another_path_is_one_model(
    model_dir, pool_file, tmp_path, monkeypatch
) -> None:
    """``-m models/base`` then ``--resume -m ./models/base``: one model, its rows kept under
    the new name (today: measured again and paired with itself)."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "b.parquet"
    common = ("-p", pool_file, "--n", 1, "--bootstrap", 0, "-o", out)
    assert invoke("bshared", "-m", "models/base", "--seeds", 2, *common).exit_code == 0
    result = invoke("bshared", "-m", "./models/base", "--seeds", 3, *common, "--resume")
    assert result.exit_code == 0, result.output
    assert "kept under the new name" in result.output
    per_seed = pd.read_parquet(out)
    assert set(per_seed["model"]) == {"./models/base"} and sorted(set(per_seed["seed"])) == [
        0,
        1,
        2,
    ]
    assert pd.read_parquet(tmp_path / "b.summary.parquet").query("kind == 'paired'").empty
    refused(invoke("bshared", "-m", "models/base", "-m", "./models/base", *common),
            "the same model is given twice")  # fmt: skip


# -- kernels, threads, versions -------------------------------------------------------------
def test_threads_and_versions_are_recorded_and_warned_about(model_dir, pool_file, tmp_path):
    out = tmp_path / "p.parquet"
    args = ("probe", "-m", model_dir, "-p", pool_file, "--n", 1, "-o", out)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert invoke(*args, "--seeds", 1).exit_code == 0
        meta = cio.read_parquet(out)[1]
        assert meta["threads"] == 1 and meta["numpy_version"] == np.__version__
        frame, meta = cio.read_parquet(out)
        cio.write_parquet(frame, out, {**meta, "torch_version": "2.0.0"})
        torch.set_num_threads(2)
        result = invoke(*args, "--seeds", 2, "--resume")
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    warning = [line for line in result.output.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "thread count 1 -> 2" in warning[0]
    assert f"torch 2.0.0 -> {torch.__version__.split('+')[0]}" in warning[0]
    assert cio.read_parquet(out)[1]["threads"] == 2


def test_another_attention_kernel_is_refused(model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "p.parquet"
    args = ("probe", "-m", model_dir, "-p", pool_file, "--n", 1, "-o", out)
    assert invoke(*args, "--seeds", 1, "--attn", "eager").exit_code == 0
    refused(invoke(*args, "--seeds", 2, "--resume"), "attention kernel (--attn)")
    assert invoke(*args, "--seeds", 2, "--resume", "--attn", "eager").exit_code == 0


# -- rows cdscope cannot have written -------------------------------------------------------
def test_resume_onto_a_file_with_a_nan_row(model_dir, pool_file, tmp_path) -> None:
    out = tmp_path / "p.parquet"
    args = ("probe", "-m", model_dir, "-p", pool_file, "--n", 2, "-o", out)
    assert invoke(*args, "--seeds", 2).exit_code == 0
    frame, meta = cio.read_parquet(out)
    frame.loc[(frame["seed"] == 1) & ~frame["dropped"], "C"] = np.nan
    cio.write_parquet(frame, out, meta)
    refused(invoke(*args, "--seeds", 3, "--resume"), "cannot have written", "C of family")
    redone = invoke(*args, "--seeds", 3, "--resume=recompute")
    assert redone.exit_code == 0 and "keeping 1 finished" in redone.output, redone.output
    fresh = tmp_path / "fresh.parquet"
    assert invoke("probe", "-m", model_dir, "-p", pool_file, "--n", 2, "--seeds", 3,
                  "-o", fresh).exit_code == 0  # fmt: skip
    got = pd.read_parquet(out).sort_values(["seed", "family", "gate"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, pd.read_parquet(fresh))


# -- eval: task contents ---------------------------------------------------------------------
def _eval_tasks(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"math/a/{i}", "family": "math", "prompt": p,
                                        "verifier": "math", "answer": "2"}) + "\n"
                            for i, p in enumerate(prompts)))  # fmt: skip
    return path


def test_eval_never_resumes_an_edited_task(model_dir, tmp_path) -> None:
    tasks = _eval_tasks(tmp_path / "t.jsonl", ["1+1=", "4-2=", "6/3="])
    out = tmp_path / "ev"
    args = ("eval", "-m", model_dir, "--n", 2, "--max-new-tokens", 3, "-o", out)
    assert invoke(*args, "--tasks", tasks, "--limit", 2).exit_code == 0
    before = pd.read_parquet(out / "samples.parquet")
    _eval_tasks(tasks, ["1+1=", "9-7=", "6/3="])  # the second prompt edited in place
    refused(invoke(*args, "--tasks", tasks, "--resume"), "math/a/1", "changed")
    moved = _eval_tasks(tmp_path / "moved.jsonl", ["1+1=", "9-7=", "6/3="])
    redone = invoke(*args, "--tasks", moved, "--resume=recompute")
    assert redone.exit_code == 0, redone.output
    after = pd.read_parquet(out / "samples.parquet")
    assert sorted(set(after["problem_id"])) == ["math/a/0", "math/a/1", "math/a/2"]
    kept = lambda f: f[f["problem_id"] == "math/a/0"].reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(kept(after), kept(before))  # unchanged problem: kept
    fresh = tmp_path / "fresh"
    assert invoke("eval", "-m", model_dir, "--n", 2, "--max-new-tokens", 3, "--tasks", moved,
                  "-o", fresh).exit_code == 0  # fmt: skip
    key = ["problem_id", "sample"]
    pd.testing.assert_frame_equal(
        after.sort_values(key).reset_index(drop=True),
        pd.read_parquet(fresh / "samples.parquet").sort_values(key).reset_index(drop=True),
    )
    assert invoke(*args, "--tasks", moved, "--resume").exit_code == 0  # moved, same content


# -- train: probe and task contents ----------------------------------------------------------
def test_train_resume_compares_probe_and_task_contents_not_paths(tmp_path) -> None:
    from cdscope.commands.train import run_train
    from tests.helpers import write_pool

    files = {"tasks": write_tasks_file(tmp_path / "tasks.jsonl"),
             "pool": write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4})}  # fmt: skip
    out = tmp_path / "run"

    def run(cfg, **kwargs):
        return run_train(cfg, model=tiny_model("llama", "sdpa"), tokenizer=byte_tokenizer(),
                         reward_fn=parity_reward, **kwargs)  # fmt: skip

    cfg = config(files, out, steps=2, save_every=1)
    run(cfg, stop_after=1)
    pool = files["pool"].read_text()
    # edited in place (every target: the training probe's half included; an edit of the
    # audit half alone leaves the training probe, and so the run, as it was)
    files["pool"].write_text(pool.replace("answer", "result"))
    with pytest.raises(CdscopeError, match="probe content differs"):
        run(cfg, resume=True)
    files["pool"].write_text(pool)
    tasks = files["tasks"].read_text()
    files["tasks"].write_text(tasks.replace("what is 0 + 1", "what is 0 + 2"))
    with pytest.raises(CdscopeError, match="training task content differs"):
        run(cfg, resume=True)
    moved = tmp_path / "elsewhere" / "tasks.jsonl"
    moved.parent.mkdir()
    moved.write_text(tasks)  # the same tasks at another path: the same run
    resumed = run(config({**files, "tasks": moved}, out, steps=2, save_every=1), resume=True)
    assert resumed.resumed_from == 1 and resumed.steps_done == 2
