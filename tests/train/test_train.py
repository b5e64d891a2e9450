"""cdscope train on tiny models: CD-RFT step, projection, exact resume, checkpoints, bad input."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from cdscope.analysis.spectral import b_shared
from cdscope.cli import app
from cdscope.commands.audit import AUDITS
from cdscope.commands.audit_run import run_audit
from cdscope.commands.requests import ProbeRequest
from cdscope.commands.train import run_train
from cdscope.core.control import control_autograd
from cdscope.core.gating.model import GatedModel
from cdscope.core.models.opening import ModelOptions
from cdscope.core.probes import load_pool, split_pool
from cdscope.core.regularizer import regularizer_grad
from cdscope.errors import CdscopeError
from cdscope.io import read_parquet
from cdscope.output.frames import ProbeSettings
from cdscope.settings.training import TrainConfig
from cdscope.train import checkpoint as ckpt
from cdscope.train import loop
from cdscope.train.cdrft import add_regularizer_grad, build_probe, measure_probe, project
from cdscope.train.loop import step_task_indices
from tests.helpers import (
    TIMING_COLUMNS,
    byte_tokenizer,
    config,
    parity_reward,
    tiny_model,
    train_files,
    write_tasks_file,
)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return train_files(tmp_path)


def run(cfg: TrainConfig, **kwargs):
    model = kwargs.pop("model", None) or tiny_model("llama", "sdpa")
    return run_train(
        cfg, model=model, tokenizer=byte_tokenizer(), reward_fn=parity_reward, **kwargs
    ), model


def test_data_order_is_a_seeded_permutation_per_epoch() -> None:
    first = [i for s in range(4) for i in step_task_indices(12, 0, s, 3)]
    assert sorted(first) == list(range(12))  # one epoch covers every task once
    assert first == [i for s in range(4) for i in step_task_indices(12, 0, s, 3)]
    assert first != [i for s in range(4) for i in step_task_indices(12, 1, s, 3)]


def test_regularizer_step_adds_lambda_grad_and_projection_lowers_r(files) -> None:
    model = tiny_model("llama", "eager", dtype=torch.float64)
    pool = load_pool([files["pool"]])
    batch = build_probe(pool, byte_tokenizer(), 0, 2, pool.families)
    params = [p for p in model.parameters()]
    with GatedModel(model) as gm:
        reference = regularizer_grad(gm, batch, "exact", params=params)
        for p in params:
            p.grad = torch.ones_like(p)
        add_regularizer_grad(gm, batch, params, 0.5, "exact", 0.01)
        for p, g in zip(params, reference.grads, strict=True):
            torch.testing.assert_close(p.grad, 1.0 + 0.5 * g)
        start = measure_probe(gm, batch)
        # the measurement is the library's B_shared of control_autograd's C
        assert start.b_shared == pytest.approx(
            float(b_shared(control_autograd(gm, batch).C_kept()))
        )
        before = [p.detach().clone() for p in params]
        result = project(gm, batch, params, tau=34.0, k_max=3, eta_proj=1e-3,
                         estimator="exact", eps=0.01)  # fmt: skip
        assert result.iterations == 3  # B_shared stays above 34% on a random model
        assert result.after.R < start.R  # gradient steps on R lower R
        # one projection step is exactly theta - eta * grad R
        for p, b in zip(params, before, strict=True):
            p.data.copy_(b)
        one = project(gm, batch, params, 34.0, 1, 0.05, "exact", 0.01)
        assert one.iterations == 1
        for p, b, g in zip(params, before, reference.grads, strict=True):
            torch.testing.assert_close(p.detach(), b - 0.05 * g)
        none = project(gm, batch, params, tau=100.0, k_max=3, eta_proj=0.05,
                       estimator="exact", eps=0.01)  # fmt: skip
        assert none.iterations == 0
        assert none.grad_norm_max == none.moved == 0.0
        # --proj-max-norm: a step along grad R scaled to norm X when ||grad R|| > X
        norm = float(torch.cat([g.flatten() for g in reference.grads]).norm())
        for p, b in zip(params, before, strict=True):
            p.data.copy_(b)
        plain = project(gm, batch, params, 34.0, 1, 0.05, "exact", 0.01, max_norm=10 * norm)
        assert plain.grad_norm_max == pytest.approx(norm) and plain.moved == pytest.approx(
            0.05 * norm
        )
        for p, b in zip(params, before, strict=True):
            p.data.copy_(b)
        capped = project(gm, batch, params, 34.0, 1, 0.05, "exact", 0.01, max_norm=norm / 4)
        assert capped.grad_norm_max == pytest.approx(norm)
        assert capped.moved == pytest.approx(0.05 * norm / 4)
        for p, b, g in zip(params, before, reference.grads, strict=True):
            torch.testing.assert_close(p.detach(), b - 0.05 / 4 * g)


def test_resume_is_bit_for_bit(files, tmp_path: Path) -> None:
    straight, m1 = run(config(files, tmp_path / "a"))
    half, _ = run(config(files, tmp_path / "b"), stop_after=2)
    assert half.steps_done == 2 and half.final_dir is None
    assert ckpt.latest_checkpoint_path(tmp_path / "b").name == "step-000002"
    resumed, m2 = run(config(files, tmp_path / "b"), resume=True)
    assert resumed.resumed_from == 2
    for (name, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    log_a = straight.log.drop(columns=TIMING_COLUMNS)
    log_b = resumed.log.drop(columns=TIMING_COLUMNS)
    pd.testing.assert_frame_equal(log_a, log_b, check_exact=True)
    on_disk, meta = read_parquet(tmp_path / "b" / "log.parquet")
    pd.testing.assert_frame_equal(on_disk.drop(columns=TIMING_COLUMNS), log_b, check_exact=True)
    assert meta["config"]["regularizer"] == "cdrft"
    # the run really trained: parameters moved, projection ran, rewards varied
    assert not torch.equal(m1.state_dict()["lm_head.weight"], tiny_model("llama").lm_head.weight)
    assert (straight.log["proj_iters"] > 0).any()
    assert straight.log["reward"].between(0, 1).all() and straight.log["reward"].std() >= 0
    assert {"reward_code", "reward_logic", "reward_math"} <= set(straight.log.columns)


def test_arms_share_rollouts_and_differ_only_by_regulariser(files, tmp_path: Path) -> None:
    cd, _ = run(config(files, tmp_path / "cd", steps=1))
    none, _ = run(config(files, tmp_path / "none", steps=1, regularizer="none"))
    # step 1 starts from the same model: same rollouts, rewards, loss and probe measurement
    for column in ("reward", "loss", "b_shared_before", "r_before", "completion_tokens"):
        assert cd.log[column].iloc[0] == none.log[column].iloc[0], column
    assert none.log["proj_iters"].iloc[0] == 0 and np.isnan(none.log["r_regularizer"].iloc[0])
    assert cd.log["b_shared_after"].iloc[0] != none.log["b_shared_after"].iloc[0]


def test_cdrft_at_head_granularity_regularises_head_level_b_shared(files, tmp_path: Path) -> None:
    """``--granularity head`` (issue 15, part 5): the probe measurement the step logs is
    B_shared of the head-level C (recomputed here from the first step's starting model),
    the regulariser moves it, and the setting is fixed across --resume."""
    model = tiny_model("llama", "sdpa")
    with GatedModel(model, granularity="head") as gm:
        pool = split_pool(load_pool([files["pool"]]), "train")  # the training probe's half
        probe = build_probe(pool, byte_tokenizer(), 0, 2, pool.families)
        expected = b_shared(control_autograd(gm, probe).C)
    head, _ = run(config(files, tmp_path / "head", steps=1, granularity="head"), model=model)
    sub, _ = run(config(files, tmp_path / "sub", steps=1))
    assert head.log["b_shared_before"].iloc[0] == pytest.approx(expected, rel=1e-6)
    assert head.log["b_shared_before"].iloc[0] != sub.log["b_shared_before"].iloc[0]
    assert head.log["b_shared_after"].iloc[0] != head.log["b_shared_before"].iloc[0]
    with pytest.raises(CdscopeError, match="granularity"):
        run(config(files, tmp_path / "head", steps=2, granularity="sublayer"), resume=True)


def test_final_model_loads_in_bshared(files, tmp_path: Path) -> None:
    result, _ = run(config(files, tmp_path / "run", steps=2, regularizer="none"))
    assert (result.final_dir / "config.json").is_file()
    request = ProbeRequest(
        tmp_path / "bshared.parquet", [str(result.final_dir)],
        ProbeSettings((0,), 2, "plain", "autograd", None), probe_paths=[files["pool"]],
        options=ModelOptions("cpu", "float32", "auto"),
    )  # fmt: skip
    audit = run_audit(AUDITS["bshared"], request)
    frame = audit.per_seed
    value = float(frame.loc[frame["measure"] == "B_shared_C", "value"].iloc[0])
    assert 1 / 3 <= value <= 1


def test_disk_full_keeps_previous_checkpoint(files, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "run"
    run(config(files, out, steps=4, save_every=2), stop_after=2)
    real = ckpt.save_model

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_model", full)
    with pytest.raises(CdscopeError, match="disk full.*step-000002 is still the latest"):
        run(config(files, out, steps=4, save_every=2), resume=True)
    monkeypatch.setattr(ckpt, "save_model", real)
    assert ckpt.latest_checkpoint_path(out).name == "step-000002"
    leftovers = [p.name for p in (out / "checkpoints").iterdir()]
    assert sorted(leftovers) == ["latest", "step-000002"]  # no half-written folder


def test_diverging_loss_stops_and_keeps_last_good_checkpoint(files, tmp_path, monkeypatch) -> None:
    out = tmp_path / "run"
    real = loop.backbone_backward
    calls = {"n": 0}

    def poisoned(model, *args, **kwargs):
        stats = real(model, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 3:  # step 3: a NaN gradient (an absurd lr does the same, less reliably)
            next(model.parameters()).grad.fill_(float("nan"))
        return stats

    monkeypatch.setattr(loop, "backbone_backward", poisoned)
    with pytest.raises(CdscopeError, match="diverged at step 3.*step-000002"):
        run(config(files, out, steps=4, save_every=1))
    assert ckpt.latest_checkpoint_path(out).name == "step-000002"
    assert len(pd.read_parquet(out / "log.parquet")) == 2


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tau": 20.0}, r"--tau .*\[33.33, 100\]"),
        ({"tau": 101.0}, "--tau"),
        ({"steps": 0}, "--steps must be a positive"),
        ({"group_size": 1}, "--group-size must be at least 2"),
        ({"prompts_per_step": -1}, "--prompts-per-step"),
        ({"regularizer": "l2"}, "--regularizer"),
        ({"eps": 1e-9, "dtype": "float32"}, "rounded away"),
        ({"granularity": "edge"}, "--granularity must be one of sublayer, head"),
        ({"proj_max_norm": 0.0}, "--proj-max-norm must be a positive finite number"),
        ({"proj_max_norm": float("nan")}, "--proj-max-norm must be a finite number"),
        ({"proj_max_norm": float("inf")}, "--proj-max-norm must be a finite number"),
    ],
)
def test_bad_settings(files, tmp_path: Path, changes, message: str) -> None:
    with pytest.raises(CdscopeError, match=message):
        run(config(files, tmp_path / "run", **changes))


def test_bad_task_inputs(files, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "family": "math"}\n')
    with pytest.raises(CdscopeError, match="bad.jsonl:1"):
        run(config(files, tmp_path / "a", tasks=(str(bad),)))
    only_math = write_tasks_file(tmp_path / "math.jsonl", families=("math",))
    with pytest.raises(CdscopeError, match="code, logic have no training tasks"):
        run(config(files, tmp_path / "b", tasks=(str(only_math),)))
    run(config(files, tmp_path / "c", steps=1))
    with pytest.raises(CdscopeError, match="already holds a training run"):
        run(config(files, tmp_path / "c", steps=1))


def test_cli_bad_input_exits_2(files, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app,
        ["train", "--tasks", str(files["tasks"]), "--probe", str(files["pool"]),
         "--tau", "10", "--out-dir", str(tmp_path / "r")],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--tau" in result.output


def test_cli_trains_with_the_real_verifiers_and_bshared_loads_the_result(
    files, tmp_path: Path, tiny_model_dir: Path
) -> None:
    """The user's path end to end: a local model directory, verifier rewards, the per-step
    log, the final folder audited by ``cdscope bshared``."""
    out = tmp_path / "run"
    common = ["--probe", str(files["pool"])]
    result = CliRunner().invoke(
        app,
        ["train", "--model", str(tiny_model_dir), "--tasks", str(files["tasks"]), *common,
         "--out-dir", str(out), "--steps", "2", "--prompts-per-step", "3", "--group-size", "2",
         "--max-new-tokens", "4", "--regularizer", "cdrft", "--tau", "34", "--k-max", "1",
         "--estimator", "proxy", "--probe-n", "2", "--save-every", "1", "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)  # --json: the table's rows, one JSON object
    assert [r["step"] for r in payload["log"]] == [1, 2] and payload["outputs"]["final"]
    log, meta = read_parquet(out / "log.parquet")
    assert list(log["step"]) == [1, 2] and meta["model"]["dtype"] == "float32"
    assert log["reward"].between(0, 1).all() and (log["regularizer_s"] > 0).all()
    # each step opens at the theta the previous one closed at: one measurement, carried over
    assert log["b_shared_before"].iloc[1] == log["b_shared_after"].iloc[0]
    audit = CliRunner().invoke(
        app, ["bshared", "-m", str(out / "final"), *common, "--n", "2", "--seeds", "1",
              "--probe-split", "train", "--out", str(tmp_path / "b.parquet"), "--json"],
    )  # fmt: skip
    assert audit.exit_code == 0, audit.output
    # the training probe itself (its half, its seed): the audit says so in one line
    assert "was trained (--regularizer cdrft) on a probe that shares 6 item(s)" in audit.output
    (row,) = [r for r in json.loads(audit.stdout)["per_seed"] if r["measure"] == "B_shared_C"]
    assert abs(row["value"] - log["b_shared_after"].iloc[1]) < 1e-6  # the same probe, reloaded


def test_code_tasks_without_a_sandbox_are_refused_before_training(
    files, tmp_path: Path, monkeypatch
) -> None:
    from cdscope.tasks.sandbox import layers as sandbox

    monkeypatch.setattr(sandbox, "sandbox_available", lambda: (False, "no namespaces, no rlimits"))
    code_task = {
        "id": "code/x/0", "family": "code", "prompt": "def f():\n", "verifier": "code",
        "tests": "def check(c):\n    assert c() == 1\n", "entry_point": "f",
    }  # fmt: skip
    tasks = tmp_path / "mixed.jsonl"
    tasks.write_text(files["tasks"].read_text() + json.dumps(code_task) + "\n")
    cfg = config(files, tmp_path / "run", tasks=(str(tasks),))
    with pytest.raises(CdscopeError, match="cannot score code tasks: no sandbox here"):
        run_train(cfg, model=tiny_model("llama", "sdpa"), tokenizer=byte_tokenizer())
    assert not (tmp_path / "run" / "log.parquet").exists()


def test_resume_refuses_settings_that_change_the_arithmetic(files, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run(config(files, out, steps=2, save_every=1), stop_after=1)
    for change in ({"micro_batch_size": 2}, {"lr": 2e-3}, {"probe_batch_size": 3}):
        with pytest.raises(CdscopeError, match=f"settings differ .*{next(iter(change))}"):
            run(config(files, out, steps=2, save_every=1, **change), resume=True)
    resumed, _ = run(config(files, out, steps=2, save_every=5), resume=True)  # cadence may change
    assert resumed.resumed_from == 1 and resumed.steps_done == 2


def test_optimizer_and_rng_states_round_trip_without_pickle(tmp_path: Path) -> None:
    """save_state / load_state: nested dicts (int keys), tuples, uint32 arrays, tensors."""
    import random

    model = tiny_model("llama", "sdpa")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randint(0, 256, (2, 5))).logits.sum().backward()
    optimizer.step()
    state = {"optimizer": optimizer.state_dict(), "rng": ckpt.rng_state(), "inf": float("inf")}
    ckpt.save_state(state, tmp_path / "s.safetensors")
    back = ckpt.load_state(tmp_path / "s.safetensors")
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    for index, slots in state["optimizer"]["state"].items():
        for name, tensor in slots.items():
            assert torch.equal(back["optimizer"]["state"][index][name], tensor), (index, name)
    numpy_state = back["rng"]["numpy"]
    assert numpy_state[1].dtype == np.uint32
    assert all(
        np.array_equal(a, b) for a, b in zip(numpy_state, state["rng"]["numpy"], strict=True)
    )
    assert back["rng"]["python"] == state["rng"]["python"] and back["inf"] == float("inf")
    ckpt.set_rng_state(back["rng"])
    first = (random.random(), np.random.rand(), float(torch.rand(1)))
    ckpt.set_rng_state(back["rng"])
    assert first == (random.random(), np.random.rand(), float(torch.rand(1)))
    with pytest.raises(TypeError, match="cannot store a object"):
        ckpt.save_state({"x": object()}, tmp_path / "bad.safetensors")


def test_an_moe_run_logs_the_routing_its_regulariser_held(files, tmp_path: Path) -> None:
    """On an MoE model each step logs the routing decisions its first-order estimates held
    (core.routing): 2 perturbed rows per probe row for the proxy estimator, one decision
    per MoE block and real probe token, once for the regulariser and once per projection
    iteration; the GRPO arm holds none, and a dense model logs 0 (issue 36 part 3)."""
    from cdscope.commands.train import prepare
    from cdscope.core.models.architecture import architecture_of
    from cdscope.core.routing import moe_blocks
    from cdscope.tools import tiny

    cfg = config(files, tmp_path / "moe", steps=2, save_every=2)
    result, model = run(cfg, model=tiny.tiny_model("mixtral", 2))
    probe = prepare(cfg.replace(out_dir=str(tmp_path / "p")), None, model, byte_tokenizer(),
                    parity_reward).probe  # fmt: skip
    per_estimate = 2 * int(probe.lengths.sum()) * len(moe_blocks(model, architecture_of(model)))
    log = result.log
    assert per_estimate > 0 and (log["routing_unheld"] == 0).all()
    assert (log["routing_decisions"] == per_estimate * (1 + log["proj_iters"])).all()
    assert (log["routing_switched"] <= log["routing_decisions"]).all()
    none, _ = run(cfg.replace(out_dir=str(tmp_path / "none"), regularizer="none"),
                  model=tiny.tiny_model("mixtral", 2))  # fmt: skip
    assert (none.log["routing_decisions"] == 0).all()
    dense, _ = run(config(files, tmp_path / "dense", steps=1))
    assert (dense.log[["routing_decisions", "routing_switched"]] == 0).all(axis=None)


def test_a_cap_the_projection_never_reaches_changes_nothing(files, tmp_path: Path) -> None:
    """--proj-max-norm only scales a projection step whose grad R is longer than the cap: a
    cap above every such norm trains bit for bit like SPEC's plain step (the replication
    follow-up, benchmarks/projection_guard.py, relies on it), and a binding cap moves the
    weights by eta_proj * cap per iteration (logged as proj_moved)."""
    plain, m1 = run(config(files, tmp_path / "plain", steps=2))
    assert (plain.log["proj_iters"] > 0).all()
    largest = float(plain.log["grad_norm_proj"].max())
    loose, m2 = run(config(files, tmp_path / "loose", steps=2, proj_max_norm=2 * largest))
    for (name, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    pd.testing.assert_frame_equal(
        plain.log.drop(columns=TIMING_COLUMNS), loose.log.drop(columns=TIMING_COLUMNS)
    )
    cap = largest / 10
    tight, _ = run(config(files, tmp_path / "tight", steps=1, proj_max_norm=cap))
    row = tight.log.iloc[0]
    assert row["proj_moved"] == pytest.approx(1e-3 * cap * row["proj_iters"], rel=1e-9)
