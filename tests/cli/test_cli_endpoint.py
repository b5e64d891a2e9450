"""`cdscope eval --endpoint URL` end to end against the in-process fake OpenAI server:
samples, pass@k and metadata; a server that disappears mid-run and --resume across its
restart; every refusal one line with exit 2 and no output file."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.io import read_parquet
from cdscope.tasks import load_tasks, verify
from tests.fake_openai import Behaviour, FakeServer
from tests.helpers import refused, write_eval_tasks

runner = CliRunner()
KEYS = ["problem_id", "sample"]


def invoke(*args: object, env: dict | None = None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def run(url: str, tasks, out, *extra: object, env: dict | None = None):
    return invoke("eval", "--endpoint", url, "--tasks", tasks, "--n", 2, "--k", "1,2",
                  "--retries", 1, "--concurrency", 2, "--out", out, *extra, env=env)  # fmt: skip


def test_eval_through_a_server_writes_samples_passk_and_what_the_server_said(tmp_path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    with FakeServer() as server:
        result = run(server.url, tasks, tmp_path / "o", "--json")
    assert result.exit_code == 0, result.output
    samples, meta = read_parquet(tmp_path / "o" / "samples.parquet")
    assert len(samples) == 5 * 2 and set(samples["model"]) == {"fake"}
    by_id = {t.id: t for t in load_tasks([tasks])}
    for row in samples.itertuples():
        assert row.completion.startswith(" The answer is ")
        assert verify(by_id[row.problem_id], row.completion).passed == row.passed
    assert samples["generated_tokens"].isna().all()  # 2 choices per answer, no per-choice counts
    assert meta["endpoint"] == server.url and meta["settings"]["backend"] == "endpoint"
    model = meta["models"][0]
    assert model["name"] == "fake" and model["source"] == server.url
    assert model["device"] == "endpoint" and model["revision"].startswith("served:")
    assert model["engine"]["served_model"] == {"id": "fake", "root": "/models/fake",
                                               "object": "model", "server": "fake/1.0"}  # fmt: skip
    passk = pd.read_parquet(tmp_path / "o" / "passk.parquet")
    assert set(passk["k"]) == {1, 2} and (passk["model"] == "fake").all()
    assert '"passk"' in result.stdout


def test_a_server_that_disappears_keeps_the_finished_problems_for_resume(tmp_path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    with FakeServer() as server:
        full = run(server.url, tasks, tmp_path / "full", "--concurrency", 1)
    assert full.exit_code == 0, full.output
    with FakeServer(Behaviour(die_after=2)) as server:
        broken = run(server.url, tasks, tmp_path / "part", "--concurrency", 1)
    line = refused(broken, "cannot reach", "--resume")
    assert "Traceback" not in broken.output and line
    partial = tmp_path / "part" / "samples.partial.parquet"
    kept = pd.read_parquet(partial)
    first_two = [t.id for t in load_tasks([tasks])][:2]  # concurrency 1: in file order
    assert list(dict.fromkeys(kept["problem_id"])) == first_two and len(kept) == 4
    assert not (tmp_path / "part" / "samples.parquet").exists()
    with FakeServer() as restarted:  # another port: the URL is no part of the identity
        resumed = run(restarted.url, tasks, tmp_path / "part", "--concurrency", 1, "--resume")
        assert resumed.exit_code == 0, resumed.output
        assert "keeping 2 finished" in resumed.output
        assert len(restarted.requests) == 3  # only the three problems not finished
    a = pd.read_parquet(tmp_path / "full" / "samples.parquet").sort_values(KEYS)
    b = pd.read_parquet(tmp_path / "part" / "samples.parquet").sort_values(KEYS)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    other = [{"id": "fake", "root": "/models/other"}]  # same name, other weights
    with FakeServer(Behaviour(models=other)) as server:
        changed = run(server.url, tasks, tmp_path / "part", "--resume")
    refused(changed, "--resume", "'fake' measured with revision served:")


def test_fewer_choices_and_empty_texts(tmp_path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    with FakeServer(Behaviour(max_choices=1, empty_every=1)) as server:
        result = run(server.url, tasks, tmp_path / "o", "--limit", 1)
    assert result.exit_code == 0, result.output
    samples = pd.read_parquet(tmp_path / "o" / "samples.parquet")
    assert len(samples) == 2 * 2 and (samples["message"] == "empty completion").all()
    assert not samples["passed"].any()
    assert (samples["generated_tokens"] == 1).all()  # one choice per answer: usage is exact
    assert len(server.requests) == 4


def test_the_api_key_comes_from_the_environment_only(tmp_path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    with FakeServer(Behaviour(api_key="s3cret")) as server:
        refused(run(server.url, tasks, tmp_path / "a", env={"OPENAI_API_KEY": ""}), "401",
                "check the API key")  # fmt: skip
        ok = run(server.url, tasks, tmp_path / "b", "--limit", 1, "--api-key-env", "MY_KEY",
                 env={"MY_KEY": "s3cret"})  # fmt: skip
        assert ok.exit_code == 0, ok.output
    _, meta = read_parquet(tmp_path / "b" / "samples.parquet")
    assert "s3cret" not in str(meta)


def test_refusals_are_one_line_before_any_file(tmp_path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    out = tmp_path / "o"
    with FakeServer(Behaviour(refuse="seed")) as server:
        url = server.url
        refused(run(url, tasks, out, "--device", "cpu"), "--endpoint: the server decides --device")
        refused(run(url, tasks, out, "--dtype", "bfloat16"), "the server decides --dtype")
        refused(run(url, tasks, out, "--model", "x"), "--served-model, not --model")
        refused(run(url, tasks, out, "--backend", "vllm"), "drop --backend")
        refused(run(url, tasks, out, "--vllm-arg", "a=1"), "--vllm-arg applies to --backend vllm")
        refused(run(url, tasks, out, "--served-model", "nope"), "'nope' is not served")
        refused(run(url, tasks, out), "400: seed is not supported")
    refused(run(url, tasks, out), "cannot reach", "models")  # nothing listens there now
    refused(run("localhost:1", tasks, out), "API base URL")
    base = ["eval", "--tasks", tasks, "--out", out]
    refused(invoke(*base, "--served-model", "m"), "--served-model applies to --endpoint")
    refused(invoke(*base, "--n-per-request", 2), "--n-per-request applies to --endpoint")
    refused(invoke(*base, "--vllm-arg", "x=1"), "--vllm-arg applies to --backend vllm only")
    refused(invoke(*base, "--backend", "vllm", "--vllm-arg", "novalue"), "KEY=VALUE")
    assert not out.exists() or not any(out.glob("*.parquet"))


@pytest.mark.parametrize("split", [1, 2])
def test_n_per_request_is_part_of_the_resume_identity(tmp_path, split) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    with FakeServer() as server:
        first = run(server.url, tasks, tmp_path / "o", "--limit", 1, "--n-per-request", split)
        assert first.exit_code == 0, first.output
        assert [r["n"] for r in server.requests][:2] == ([1, 1] if split == 1 else [2, 2])
        other = run(server.url, tasks, tmp_path / "o", "--n-per-request", 3 - split, "--resume")
    refused(other, "different settings")
