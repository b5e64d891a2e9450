"""``train --report-to``: the per-step log reaches the tracker on both backends.

TensorBoard's event files are read back with TensorBoard's own reader and compared with
OUT/log.parquet, field by field and step by step.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from cdscope.cli import app
from cdscope.commands.train import prepare, run_train
from cdscope.errors import CdscopeError
from cdscope.train import loop, tracking
from tests.helpers import (
    byte_tokenizer,
    config,
    parity_reward,
    tiny_model,
    write_pool,
    write_tasks_file,
)

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="tensorboard not installed: pip install 'cdscope[tensorboard]'",
)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "tasks": write_tasks_file(tmp_path / "tasks.jsonl"),
        "pool": write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] of every event file under ``directory`` (TensorBoard's reader)."""
    runs = {p.parent for p in directory.rglob("events.out.tfevents.*")}
    assert len(runs) == 1, runs
    acc = event_accumulator.EventAccumulator(str(runs.pop()), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def assert_log_is_tracked(log: pd.DataFrame, events: dict[str, list[tuple[int, float]]]) -> None:
    """Every finite cell of log.parquet is the tracker's point of its field at its step."""
    for column in log.columns.drop("step"):
        expected = [(int(s), float(v)) for s, v in zip(log["step"], log[column], strict=True)
                    if math.isfinite(float(v))]  # fmt: skip
        got = events.get(tracking.PREFIX + column, [])
        assert [s for s, _ in got] == [s for s, _ in expected], column
        for (_, value), (_, want) in zip(got, expected, strict=True):
            # TensorBoard stores float32: floor 5.2e-8 relative measured at 1 and 2 threads
            # (float32's half ulp is 6e-8); 2.5e-7 is a 4x margin over the half ulp
            assert value == pytest.approx(want, rel=2.5e-7, abs=1e-30), column


def test_hf_loop_writes_every_log_field_to_tensorboard(files, tmp_path) -> None:
    cfg = config(files, tmp_path / "run", steps=2, save_every=1, report_to="tensorboard")
    result = run_train(cfg, model=tiny_model("llama", "sdpa"), tokenizer=byte_tokenizer(),
                       reward_fn=parity_reward)  # fmt: skip
    log = pd.read_parquet(tmp_path / "run" / "log.parquet")
    assert len(log) == 2
    events = scalars(tmp_path / "run" / tracking.TENSORBOARD_DIR)
    assert_log_is_tracked(log, events)
    assert {"train/b_shared_before", "train/reward", "train/loss", "train/proj_iters"} <= set(
        events
    )
    assert result.steps_done == 2


def test_a_resumed_run_logs_each_step_once(files, tmp_path, monkeypatch) -> None:
    """Step 2 logged but never checkpointed (as if killed): --resume takes it again and
    TensorBoard keeps only the second take."""
    cfg = config(files, tmp_path / "run", steps=3, save_every=1, report_to="tensorboard")
    real = loop.save_checkpoint

    def only_step_one(out_dir, done, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if done == 1:
            real(out_dir, done, *args, **kwargs)

    monkeypatch.setattr(loop, "save_checkpoint", only_step_one)
    run_train(cfg, model=tiny_model("llama", "sdpa"), tokenizer=byte_tokenizer(),
              reward_fn=parity_reward, stop_after=2)  # fmt: skip
    monkeypatch.setattr(loop, "save_checkpoint", real)
    run_train(cfg, resume=True, model=tiny_model("llama", "sdpa"), tokenizer=byte_tokenizer(),
              reward_fn=parity_reward)  # fmt: skip
    log = pd.read_parquet(tmp_path / "run" / "log.parquet")
    assert list(log["step"]) == [1, 2, 3]
    events = scalars(tmp_path / "run" / tracking.TENSORBOARD_DIR)
    assert [s for s, _ in events["train/b_shared_after"]] == [1, 2, 3]  # step 2 once
    assert_log_is_tracked(log, events)


def test_trl_route_passes_report_to_and_adds_the_log_fields(files, tmp_path) -> None:
    pytest.importorskip("trl", reason="trl not installed: pip install 'cdscope[trl]'")
    from cdscope.integrations.trl import grpo_config, train_with_trl

    cfg = config(files, tmp_path / "run", steps=2, micro_batch_size=2, report_to="tensorboard")
    inputs = prepare(cfg, None, tiny_model("llama", "sdpa"), byte_tokenizer(), parity_reward)
    assert grpo_config(inputs).report_to == ["tensorboard"]
    result = train_with_trl(inputs)
    log = pd.read_parquet(tmp_path / "run" / "log.parquet")
    assert list(log["step"]) == [1, 2] and result.steps_done == 2
    events = scalars(tmp_path / "run" / "trl")  # TRL's own TensorBoard run
    assert_log_is_tracked(log, events)
    assert "train/learning_rate" in events  # TRL's metrics beside cdscope's
    with pytest.raises(CdscopeError, match="--report-to"):
        grpo_config(inputs, report_to="wandb")


def test_a_missing_tracker_is_one_line_before_the_model_loads(files, tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(tracking.PACKAGES, "wandb", "cdscope_no_such_tracker")
    cfg = config(files, tmp_path / "run", report_to="wandb", model=str(tmp_path / "no-model"))
    with pytest.raises(CdscopeError, match=r"pip install 'cdscope\[wandb\]'") as error:
        run_train(cfg)  # the model path does not exist: the tracker is checked first
    assert "\n" not in str(error.value)
    result = CliRunner().invoke(app, ["train", "--report-to", "mlflow", "-o", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert "--report-to must be one of none | tensorboard | trackio | wandb" in result.output
