"""Activation checkpointing, the reentrant refusal and the no-silent-zero rule, in one process.

The sharded (FSDP2) side runs under torchrun in ``tests/train/test_fsdp.py``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pandas as pd
import pytest
import torch

from cdscope.commands.train import run_train
from cdscope.core import grad_sink
from cdscope.core.batch import encode_probe
from cdscope.core.control import control_autograd
from cdscope.core.gating import model as gates_module
from cdscope.core.gating.model import GatedModel
from cdscope.core.probes import draw_probe, load_pool
from cdscope.core.regularizer import fidelity, regularizer_grad
from cdscope.errors import CdscopeError
from cdscope.settings.training import TrainConfig
from cdscope.train.engine import checkpoint_blocks
from cdscope.train.step import CDRFTStep
from tests.helpers import (
    byte_tokenizer,
    config,
    invoke,
    parity_reward,
    tiny_model,
    write_pool,
    write_tasks_file,
)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    path = write_pool(tmp_path_factory.mktemp("pool") / "p.jsonl", {"a": 3, "b": 3, "c": 3})
    return encode_probe(draw_probe(load_pool([path]), 0, 2), byte_tokenizer(), "plain", 258)


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "tasks": write_tasks_file(tmp_path / "tasks.jsonl"),
        "pool": write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }


def _measure(model, probe, estimator: str):
    with GatedModel(model) as gm:
        control = control_autograd(gm, probe, 2)
        return control, regularizer_grad(gm, probe, estimator, 0.01, batch_size=2, nominal=control)


@pytest.mark.parametrize("estimator", ["folded", "exact"])
def test_checkpointed_blocks_give_the_same_c_and_regulariser_gradient(probe, estimator) -> None:
    plain = tiny_model("llama", "eager")
    model = copy.deepcopy(plain)
    assert checkpoint_blocks(model) == 3
    calls = []
    model.model.layers[1].mlp.register_forward_hook(lambda m, a, out: calls.append(out.shape))
    c0, g0 = _measure(plain, probe, estimator)
    c1, g1 = _measure(model, probe, estimator)
    # 5 row chunks of 2 rows, each forward once and recomputed in the gate backward (C),
    # and again in the regulariser's passes: the recomputation really ran under the gates
    assert len(calls) > 2 * 5
    # measured bit for bit (0.0): the recomputed forward is the same gated forward
    assert abs(c0.C - c1.C).max() == 0.0
    assert fidelity(g1, g0)["rel_error"] < 1e-12
    with pytest.raises(CdscopeError, match="already on"):
        checkpoint_blocks(model)


def test_reentrant_checkpointing_is_refused(probe, monkeypatch) -> None:
    """transformers' checkpointing (the TRL route) in training mode: non-reentrant gives the
    unchecked C and gradient; reentrant is refused with one line. Let through, it cannot
    measure C at all (the gates are not inputs of a reentrant checkpoint, so no gradient
    reaches them: one line too). Its parameter gradient through ``backward`` (the
    sharded path, forced here in one process) is right only because the gates stay set
    through the backward: the recomputation re-applies them."""
    plain = tiny_model("llama", "eager")  # dropout 0: training mode changes nothing else
    c0, g0 = _measure(plain, probe, "folded")
    model = copy.deepcopy(plain).train()
    model.activation_checkpointing_enable({"use_reentrant": False})
    c1, g1 = _measure(model, probe, "folded")
    assert abs(c0.C - c1.C).max() == 0.0 and fidelity(g1, g0)["rel_error"] < 1e-12
    monkeypatch.setattr(grad_sink, "is_sharded", lambda model: True)  # the .backward() sink
    with GatedModel(model) as gm:
        g2 = regularizer_grad(gm, probe, "folded", 0.01, batch_size=2, nominal=c0)
    assert fidelity(g2, g0)["rel_error"] < 1e-6  # measured 0: the .grad path, same sums
    assert all(p.grad is None for p in model.parameters())  # the caller's .grad restored
    model.activation_checkpointing_enable({"use_reentrant": True})
    with pytest.raises(CdscopeError, match="reentrant activation checkpointing") as caught:
        _measure(model, probe, "folded")
    assert "\n" not in str(caught.value)
    monkeypatch.setattr(gates_module, "refuse_reentrant_checkpointing", lambda model: None)
    with GatedModel(model) as gm:
        # the probe's case of "no gradient reached": one line, not a traceback or a zero
        with pytest.raises(CdscopeError, match="no gate was applied in the forward"):
            control_autograd(gm, probe, 2)
        held = regularizer_grad(gm, probe, "folded", 0.01, batch_size=2, nominal=c0)
    assert fidelity(held, g0)["rel_error"] < 1e-6  # measured 0 (gates held, see above)


def test_a_parameter_the_gradient_never_reaches_is_an_error(probe) -> None:
    """What used to be a silent zero (``allow_unused`` -> zeros) names the parameter."""
    model = tiny_model("llama", "eager")
    model.model.register_parameter("stray", torch.nn.Parameter(torch.ones(3)))
    for estimator in ("folded", "proxy", "exact"):
        with pytest.raises(CdscopeError, match=r"model\.stray") as caught:
            _measure(model, probe, estimator)
        assert "no gradient reached 1 trainable parameter" in str(caught.value)
    model.model.stray.requires_grad_(False)  # frozen: not asked for, no error
    _measure(model, probe, "folded")


def test_the_training_step_refuses_a_parameter_left_without_gradient(
    files, probe, tmp_path
) -> None:
    model = tiny_model("llama", "eager")
    params = [p for p in model.parameters() if p.requires_grad]
    cfg = config(files, tmp_path / "run", regularizer="none")
    with GatedModel(model) as gm:
        step = CDRFTStep(cfg, gm, probe, params, lambda: None)
        step.before_update(1)  # no gradient anywhere (a step without tokens): fine
        model(input_ids=probe.input_ids[:1]).logits.sum().backward()
        model.lm_head.weight.grad = None
        with pytest.raises(CdscopeError, match=r"training step's gradient.*lm_head\.weight"):
            step.before_update(1)


def _one_step(files, out: Path, **changes) -> dict[str, torch.Tensor]:
    cfg = config(files, out, steps=1, micro_batch_size=2, estimator="folded", **changes)
    model = tiny_model("llama", "eager")
    run_train(cfg, model=model, tokenizer=byte_tokenizer(), reward_fn=parity_reward)
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_hf_loop_with_activation_checkpointing_takes_the_same_step(files, tmp_path) -> None:
    """Bit for bit on the plain step. (The lean step's shared prompt gives way to its
    per-row path under checkpointing, which reruns a block's forward in the backward and
    would append to the prompt's cache twice: tests/train/test_lean_step.py checks that
    path's gradient against the plain one.)"""
    plain = _one_step(files, tmp_path / "plain", plain_step=True)
    checkpointed = _one_step(
        files, tmp_path / "ckpt", activation_checkpointing=True, plain_step=True
    )
    assert all(torch.equal(plain[k], checkpointed[k]) for k in plain)  # measured: bit for bit
    logs = [pd.read_parquet(tmp_path / d / "log.parquet") for d in ("plain", "ckpt")]
    assert logs[0]["b_shared_after"].equals(logs[1]["b_shared_after"])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"sharding": "zero"}, "--sharding must be one of none | fsdp"),
        ({"sharding": "fsdp", "backend": "trl"}, "accelerate's FSDP2 plugin"),
    ],
)
def test_bad_sharding_settings(files, tmp_path, changes, message) -> None:
    cfg = config(files, tmp_path / "run", **changes)
    with pytest.raises(CdscopeError, match=message):
        cfg.validate()


def test_sharding_without_a_launcher_is_one_line(files, tmp_path, monkeypatch, tiny_model_dir):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    result = invoke(  # a real model, refused before it loads (a missing one is refused first)
        "train", "--sharding", "fsdp", "--tasks", files["tasks"], "--probe", files["pool"],
        "--model", tiny_model_dir, "-o", tmp_path / "run",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "torchrun --nproc_per_node" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_new_settings_are_part_of_the_resume_identity(files, tmp_path) -> None:
    out = tmp_path / "run"
    cfg = config(files, out, steps=2, save_every=1, micro_batch_size=2)
    model = tiny_model("llama", "eager")
    run_train(cfg, stop_after=1, model=model, tokenizer=byte_tokenizer(), reward_fn=parity_reward)
    changed = cfg.replace(activation_checkpointing=True)
    with pytest.raises(CdscopeError, match="settings differ .*activation_checkpointing"):
        run_train(changed, resume=True, model=model, tokenizer=byte_tokenizer())
    saved = TrainConfig().to_dict()
    for key in ("sharding", "activation_checkpointing"):  # a checkpoint written before them
        saved.pop(key)
    restored = TrainConfig.from_dict(saved)
    assert (restored.sharding, restored.activation_checkpointing) == ("none", False)
