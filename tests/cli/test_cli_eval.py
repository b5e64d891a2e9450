"""`cdscope eval` end to end on a tiny local model; scoring with canned completions; bad inputs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.commands import evaluate as ev
from cdscope.io import read_parquet
from cdscope.tasks import load_tasks, verify
from cdscope.tasks.sandbox import code_sandbox_available
from tests.helpers import write_eval_tasks

runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def test_eval_on_a_tiny_model_writes_samples_and_passk(tiny_model_dir, tmp_path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    out, plot = tmp_path / "res", tmp_path / "passk.png"
    args = ["eval", "--model", tiny_model_dir, "--tasks", tasks, "--n", 3, "--k", "1,2,3"]
    args += ["--max-new-tokens", 6, "--temperature", 1.0, "--out", out, "--plot", plot]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    samples, meta = read_parquet(out / "samples.parquet")
    assert list(samples.columns) == ev.COMPLETION_COLUMNS
    assert len(samples) == 5 * 3 and set(samples["sample"]) == {0, 1, 2}
    assert set(samples["benchmark"]) == {"math/add", "math/mul"}
    assert (samples["generated_tokens"] <= 6).all() and (samples["generated_tokens"] >= 1).all()
    # every verdict equals the verifier run again on the stored completion
    by_id = {t.id: t for t in load_tasks([tasks])}
    for row in samples.itertuples():
        if row.completion.strip():
            assert verify(by_id[row.problem_id], row.completion).passed == row.passed
        else:
            assert not row.passed and row.message == "empty completion"
    passk = pd.read_parquet(out / "passk.parquet")
    assert set(passk["k"]) == {1, 2, 3} and set(passk["level"]) == {
        "benchmark",
        "domain",
        "overall",
    }
    assert meta["settings"]["n"] == 3 and meta["models"][0]["name"] == str(tiny_model_dir)
    assert plot.stat().st_size > 10_000
    assert "pass@k" in result.output and "tokens/s" in result.output

    # --resume: nothing to do, identical file; then a larger --limit adds only new problems
    again = invoke(*args, "--resume")
    assert again.exit_code == 0, again.output
    pd.testing.assert_frame_equal(pd.read_parquet(out / "samples.parquet"), samples)


def test_resume_regenerates_exactly_the_missing_problems(tiny_model_dir, tmp_path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    common = ["--model", tiny_model_dir, "--tasks", tasks, "--n", 2, "--max-new-tokens", 5]
    common += ["--temperature", 1.0, "--seed", 3]
    full = invoke("eval", *common, "--out", tmp_path / "full")
    assert full.exit_code == 0, full.output
    part = invoke("eval", *common, "--limit", 1, "--out", tmp_path / "part")
    assert part.exit_code == 0, part.output
    assert len(pd.read_parquet(tmp_path / "part" / "samples.parquet")) == 2 * 2
    resumed = invoke("eval", *common, "--resume", "--out", tmp_path / "part")
    assert resumed.exit_code == 0, resumed.output
    assert "keeping 2 finished" in resumed.output
    keys = ["problem_id", "sample"]
    a = pd.read_parquet(tmp_path / "full" / "samples.parquet").sort_values(keys)
    b = pd.read_parquet(tmp_path / "part" / "samples.parquet").sort_values(keys)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    changed = invoke("eval", *common, "--resume", "--n", 3, "--out", tmp_path / "part")
    assert changed.exit_code == 2 and "different settings" in changed.output


def _canned(monkeypatch, texts: dict[str, list[str]], tasks: list) -> None:
    """The hf engine answers with ``texts`` (by task id) instead of sampling."""
    from cdscope.core.engines import Generation, hf

    by_prompt = {t.prompt: texts[t.id] for t in tasks if t.id in texts}

    class Canned(hf.HFEngine):
        def generate(self, requests):
            return [Generation(by_prompt[r.prompt], [len(t) for t in by_prompt[r.prompt]])
                    for r in requests]  # fmt: skip

    monkeypatch.setattr(hf, "HFEngine", Canned)


@pytest.mark.skipif(not code_sandbox_available()[0], reason="no code sandbox on this machine")
def test_scoring_and_passk_with_canned_completions(tiny_model_dir, tmp_path, monkeypatch) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl", code=True)
    right = {t.id: f"The answer is {t.answer}." for t in load_tasks([tasks]) if t.answer}
    texts = {tid: [right[tid], "The answer is 0.", "", right[tid]] for tid in right}
    texts["math/mul/eval/1"] = ["no idea"] * 4
    texts["code/toy/0"] = [
        "    return 2 * x\n",
        "    return x + 1\n",
        "    while True: pass\n",
        " ",
    ]
    _canned(monkeypatch, texts, load_tasks([tasks]))
    result = invoke("eval", "--model", tiny_model_dir, "--tasks", tasks, "--n", 4, "--k", "1,4",
                    "--timeout", 2, "--out", tmp_path / "o")  # fmt: skip
    assert result.exit_code == 0, result.output
    samples = pd.read_parquet(tmp_path / "o" / "samples.parquet")
    code = samples[samples["problem_id"] == "code/toy/0"].sort_values("sample")
    assert code["passed"].tolist() == [True, False, False, False]
    assert "timeout" in code["message"].iloc[2] and code["message"].iloc[3] == "empty completion"
    assert (samples["message"] == "empty completion").sum() == 4 + 1
    # pass@k from the file = brute force over k-subsets of each problem's samples
    passk = pd.read_parquet(tmp_path / "o" / "passk.parquet").set_index(["level", "benchmark", "k"])
    for (bench, group), k in itertools.product(samples.groupby("benchmark"), (1, 4)):
        values = []
        for _, prob in group.groupby("problem_id"):
            subsets = list(itertools.combinations(prob["passed"].tolist(), k))
            values.append(sum(any(s) for s in subsets) / len(subsets))
        assert passk.loc[("benchmark", bench, k), "pass_at_k"] == pytest.approx(
            sum(values) / len(values)
        )
    assert passk.loc[("benchmark", "math/mul", 1), "pass_at_k"] == pytest.approx(0.25)


def test_a_benchmark_in_its_own_columns(tiny_model_dir, tmp_path, monkeypatch) -> None:
    """--tasks reads a Parquet file in a user's column names through --task-columns, and
    scores the formats models write (#### N, Answer:, boxed text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"q": "What is 6 * 7?", "a": "42", "uid": "q1"},
        {"q": "Is 7 prime?", "a": "Yes", "uid": "q2"},
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "quiz.parquet")
    texts = {"q1": ["#### 42", "Answer: 41"], "q2": ["\\boxed{\\text{Yes}}", "Answer: Yes or No"]}
    _canned(
        monkeypatch,
        texts,
        load_tasks([tmp_path / "quiz.parquet"], columns="prompt=q,answer=a,id=uid,verifier=logic"),
    )
    args = ["eval", "--model", tiny_model_dir, "--tasks", tmp_path / "quiz.parquet", "--n", 2]
    unmapped = invoke(*args, "--k", 1, "--out", tmp_path / "x")
    _fails_cleanly(unmapped, tmp_path / "x", "cannot tell the schema")
    result = invoke(*args, "--k", 1, "--task-columns", "prompt=q,answer=a,id=uid,verifier=logic",
                    "--out", tmp_path / "o")  # fmt: skip
    assert result.exit_code == 0, result.output
    samples = pd.read_parquet(tmp_path / "o" / "samples.parquet").sort_values(
        ["problem_id", "sample"]
    )
    assert samples["passed"].tolist() == [True, False, True, False]


def _fails_cleanly(result, out: Path, needle: str) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], result.output
    assert not (out / "samples.parquet").exists() and not (out / "passk.parquet").exists()


def test_bad_inputs_exit_2_with_one_line_and_no_file(tiny_model_dir, tmp_path, monkeypatch) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    out = tmp_path / "o"
    base = ["eval", "--model", tiny_model_dir, "--out", out]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(tasks.read_text() + '{"id": "x", "family": "math"}\n')
    _fails_cleanly(invoke(*base, "--tasks", bad), out, "bad.jsonl:6")
    _fails_cleanly(invoke(*base, "--tasks", tasks, "--n", 2, "--k", "1,5"), out, "n=2")
    _fails_cleanly(invoke(*base, "--tasks", tasks, "--k", "one"), out, "--k")
    _fails_cleanly(invoke(*base, "--tasks", tasks, "--backend", "vllm"), out, "make setup-vllm")
    _fails_cleanly(invoke(*base, "--tasks", tasks, "--max-new-tokens", "code:5"), out, "DOMAIN=N")
    hard = tmp_path / "hard.txt"
    hard.write_text("math/add/eval/0\nnot/a/task\n")
    _fails_cleanly(invoke(*base, "--tasks", tasks, "--hard", hard), out, "not/a/task")
    with_code = write_eval_tasks(tmp_path / "c.jsonl", code=True)
    from cdscope.tasks.sandbox import layers as sandbox

    monkeypatch.setattr(sandbox, "sandbox_available", lambda: (False, "no namespaces"))
    _fails_cleanly(invoke(*base, "--tasks", with_code), out, "no sandbox")


def test_hard_subset_and_audit_without_a_model(tiny_model_dir, tmp_path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    hard = tmp_path / "hard.txt"
    hard.write_text("# hard ones\nmath/mul/eval/1\n")
    out = tmp_path / "o"
    result = invoke("eval", "--model", tiny_model_dir, "--tasks", tasks, "--n", 1,
                    "--max-new-tokens", 3, "--hard", hard, "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    passk = pd.read_parquet(out / "passk.parquet")
    hard_rows = passk[passk["subset"] == "hard"]
    assert set(hard_rows["benchmark"]) == {"math/mul", ""} and hard_rows["problems"].max() == 1
    audit = invoke("eval", "--audit", "--out", tmp_path / "a")
    assert audit.exit_code == 0, audit.output
    frame = pd.read_parquet(tmp_path / "a" / "contamination.parquet")
    assert set(frame["against"]) == {"train", "probes"} and (frame["exact"] == 0).all()
    assert not (tmp_path / "a" / "samples.parquet").exists()


def test_audit_against_the_users_own_train_and_probe_files(tmp_path) -> None:
    """--audit-train / --audit-probe replace the shipped references: a planted copy of an
    eval prompt is found in the user's training file, and the probes are theirs."""
    from tests.helpers import write_pool

    evals = write_eval_tasks(tmp_path / "eval.jsonl")
    leaked = load_tasks([evals])[0]
    train = tmp_path / "train.jsonl"
    record = {"id": "mine/0", "family": leaked.family, "prompt": leaked.prompt,
              "verifier": leaked.verifier, "answer": leaked.answer}  # fmt: skip
    train.write_text(json.dumps(record) + "\n")
    pool = write_pool(tmp_path / "pool.jsonl", {"math": 2})
    result = invoke("eval", "--audit", "--tasks", evals, "--audit-train", train,
                    "--audit-probe", pool, "--out", tmp_path / "a")  # fmt: skip
    assert result.exit_code == 0, result.output
    frame, meta = read_parquet(tmp_path / "a" / "contamination.parquet")
    assert frame.loc[frame["against"] == "train", "exact"].sum() == 1
    assert meta["train_files"] == [str(train)] and meta["probe_files"] == [str(pool)]
