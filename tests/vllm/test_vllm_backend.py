"""``eval --backend vllm`` for real, in vLLM's CPU build (``make test-vllm``; skipped in
the main environment, which has no vLLM): per-problem seeds make a problem's samples
independent of the batch it is drawn in, greedy decoding agrees with the hf backend, and
the command writes samples and pass@k and resumes exactly."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

pytest.importorskip("vllm", reason="needs vLLM: make setup-vllm, then make test-vllm")

from cdscope.cli import app  # noqa: E402
from cdscope.core.engines import GenRequest  # noqa: E402
from cdscope.core.engines.hf import HFEngine  # noqa: E402
from cdscope.core.engines.vllm import VLLMEngine  # noqa: E402
from cdscope.core.models import load_model  # noqa: E402
from cdscope.core.models.loading import embedded_model_dir  # noqa: E402
from cdscope.io import read_parquet  # noqa: E402
from tests.helpers import write_eval_tasks  # noqa: E402

PROMPTS = [
    "What is 7 + 5?\nSolution:\n",
    "Name the capital of France.\nAnswer:",
    "def add(a, b):\n",
    "Sort the numbers 3, 1, 2 in ascending order.\nAnswer:",
    "Is 17 a prime number? Answer yes or no.\nAnswer:",
    "Simplify the fraction 6/8.\nSolution:\n",
]
REQUESTS = [GenRequest(p, 2, 24, 1000 + i) for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def engine() -> VLLMEngine:
    directory, _ = embedded_model_dir()
    made = VLLMEngine(str(directory), "float32", 0.6, 1.0, seed=0, per_call=8)
    yield made
    made.close()


def test_a_problems_samples_do_not_depend_on_its_batch(engine) -> None:
    together = engine.generate(REQUESTS)
    alone = [engine.generate([r])[0] for r in REQUESTS[:3]]
    backwards = engine.generate(REQUESTS[::-1])[::-1]
    assert [g.texts for g in alone] == [g.texts for g in together[:3]]
    assert [g.texts for g in backwards] == [g.texts for g in together]
    assert all(len(g.texts) == 2 and all(1 <= t <= 24 for t in g.tokens) for g in together)
    # the seed decides: another seed gives other samples (not a constant answer)
    other = engine.generate([GenRequest(r.prompt, 2, 24, r.seed + 1) for r in REQUESTS])
    assert sum(a.texts != b.texts for a, b in zip(other, together, strict=True)) >= 4


def test_greedy_completions_agree_with_the_hf_backend(engine) -> None:
    """Both engines decode argmax over float32 logits of the same checkpoint; they may
    part where two logits tie within the kernels' rounding (measured: 6 of 6 identical)."""
    loaded = load_model(device="cpu", dtype="float32")
    hf = HFEngine(loaded.model, loaded.tokenizer, 0.0, 1.0, None)
    engine.temperature = 0.0
    try:
        ours = [g.texts[0] for g in engine.generate([GenRequest(p, 1, 32, 0) for p in PROMPTS])]
    finally:
        engine.temperature = 0.6
    ref = [g.texts[0] for g in hf.generate([GenRequest(p, 1, 32, 0) for p in PROMPTS])]
    same = sum(a == b for a, b in zip(ours, ref, strict=True))
    assert same >= 5, list(zip(ours, ref, strict=True))


def test_eval_backend_vllm_writes_samples_and_resumes_exactly(tmp_path: Path) -> None:
    tasks = write_eval_tasks(tmp_path / "t.jsonl")
    common = ["eval", "--backend", "vllm", "--tasks", tasks, "--n", 3, "--k", "1,3",
              "--max-new-tokens", 16, "--seed", 5]  # fmt: skip
    runner = CliRunner()

    def run(*extra: object):  # noqa: ANN202
        result = runner.invoke(app, [str(a) for a in [*common, *extra]])
        assert result.exit_code == 0, result.output
        return result

    run("--out", tmp_path / "full")
    samples, meta = read_parquet(tmp_path / "full" / "samples.parquet")
    assert len(samples) == 5 * 3 and set(samples["sample"]) == {0, 1, 2}
    assert (samples["generated_tokens"].between(1, 16)).all()
    record = meta["models"][0]
    assert record["engine"]["engine"] == "vllm" and record["revision"].startswith("gguf-sha256:")
    assert meta["settings"]["backend"] == "vllm"
    assert set(pd.read_parquet(tmp_path / "full" / "passk.parquet")["k"]) == {1, 3}
    run("--limit", 1, "--out", tmp_path / "part")
    resumed = run("--out", tmp_path / "part", "--resume")
    assert "keeping 2 finished" in resumed.output
    keys = ["problem_id", "sample"]
    a = pd.read_parquet(tmp_path / "full" / "samples.parquet").sort_values(keys)
    b = pd.read_parquet(tmp_path / "part" / "samples.parquet").sort_values(keys)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
