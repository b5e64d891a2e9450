"""TRL route: the GRPO loss against TRL's on identical tensors, and 2 CD-RFT steps on GRPOTrainer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import torch

from cdscope.commands.train import prepare
from cdscope.train.grpo import (
    completion_logprobs,
    per_token_loss,
    token_weights,
    weighted_token_sum,
)
from tests.helpers import (
    byte_tokenizer,
    config,
    parity_reward,
    tiny_model,
    write_pool,
    write_tasks_file,
)

trl = pytest.importorskip("trl", reason="trl not installed: pip install 'cdscope[trl]'")

from cdscope.integrations.trl import CDRFTCallback, grpo_config, train_with_trl  # noqa: E402


@pytest.fixture
def inputs(tmp_path: Path):
    files = {
        "tasks": write_tasks_file(tmp_path / "tasks.jsonl"),
        "pool": write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }
    cfg = config(files, tmp_path / "run", steps=2, temperature=1.0, micro_batch_size=2)
    model = tiny_model("llama", "sdpa")
    return prepare(cfg, None, model, byte_tokenizer(), parity_reward)


def _trainer(inputs, **overrides):
    from datasets import Dataset

    data = Dataset.from_list(
        [{"prompt": t.prompt, "task_index": i} for i, t in enumerate(inputs.tasks)]
    )
    return trl.GRPOTrainer(
        model=inputs.model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
        args=grpo_config(inputs, **overrides), train_dataset=data,
        processing_class=inputs.tokenizer,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("beta", "loss_type", "epsilon_high"),
    [(0.0, "dapo", None), (0.04, "dapo", None), (0.0, "grpo", None), (0.04, "dr_grpo", 0.28),
     (0.0, "bnpo", 0.28)],
)  # fmt: skip
def test_loss_and_gradient_match_trl(inputs, beta: float, loss_type: str, epsilon_high) -> None:
    """TRL's GRPOTrainer._compute_loss vs cdscope's token_weights on the same tensors, for
    every --loss-type (with one update per batch the ratio is 1, so --epsilon-high leaves
    the value and the gradient as they are, in both)."""
    cfg = inputs.cfg.replace(loss_type=loss_type, epsilon_high=epsilon_high)
    inputs = dataclasses.replace(inputs, cfg=cfg)
    trainer = _trainer(inputs)
    assert (trainer.loss_type, trainer.epsilon_high) == (loss_type, epsilon_high or 0.2)
    trainer.beta = beta  # set after init: TRL would load a reference model from disk
    trainer.current_gradient_accumulation_steps = 1
    trainer.args.steps_per_generation = 1
    model = trainer.model
    torch.manual_seed(0)
    N, P, T = 6, 7, 5  # noqa: N806 - equal-length prompts: TRL passes no position ids
    prompt_ids = torch.randint(0, 256, (N, P))
    completion_ids = torch.randint(0, 256, (N, T))
    completion_mask = torch.ones(N, T, dtype=torch.long)
    completion_mask[1, 3:] = 0
    completion_mask[4, 1:] = 0
    advantages = torch.tensor([1.2, -0.3, 0.0, -0.9, 0.5, -0.5])
    prompt_mask = torch.ones(N, P, dtype=torch.long)
    with torch.no_grad():
        ref = completion_logprobs(
            tiny_model("llama", "sdpa", seed=1), prompt_ids, prompt_mask, completion_ids,
            completion_mask,
        )  # fmt: skip
    batch = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "advantages": advantages,
        "ref_per_token_logps": ref, "num_items_in_batch": completion_mask.sum(),
    }  # fmt: skip
    model.zero_grad(set_to_none=True)
    theirs = trainer._compute_loss(model, batch)
    theirs.backward()
    their_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    logp = completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask)
    loss_t, _ = per_token_loss(logp, logp.detach(), advantages, 0.2, beta, ref, epsilon_high)
    weights = token_weights(completion_mask.bool(), loss_type, cfg.max_new_tokens)
    ours = weighted_token_sum(loss_t, completion_mask, weights)
    ours.backward()
    torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-5, atol=1e-6)
    for a, b in zip((p.grad for p in model.parameters()), their_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert sum(float(g.norm()) for g in their_grads) > 1e-4


def test_two_cdrft_steps_on_grpo_trainer(inputs) -> None:
    before = {k: v.clone() for k, v in inputs.model.state_dict().items()}
    calls = {"pre": 0}
    real = CDRFTCallback.on_pre_optimizer_step

    def counted(self, *args, **kwargs):
        calls["pre"] += 1
        return real(self, *args, **kwargs)

    CDRFTCallback.on_pre_optimizer_step = counted
    try:
        result = train_with_trl(inputs)
    finally:
        CDRFTCallback.on_pre_optimizer_step = real
    # 3 prompts x 2 samples in micro-batches of 2: 3 accumulation steps per optimizer step,
    # yet the regulariser ran exactly once per optimizer step
    assert grpo_config(inputs).gradient_accumulation_steps == 3
    assert calls["pre"] == 2
    log = pd.read_parquet(Path(inputs.cfg.out_dir) / "log.parquet")
    assert list(log["step"]) == [1, 2]
    expected = {"reward", "loss", "b_shared_before", "b_shared_after", "proj_iters", "step_s"}
    assert expected <= set(log.columns)
    assert log["b_shared_before"].between(1 / 3, 1).all()
    assert not torch.equal(before["lm_head.weight"], inputs.model.state_dict()["lm_head.weight"])
    assert (result.final_dir / "config.json").is_file()


def test_trl_overrides_are_checked(inputs) -> None:
    from cdscope.errors import CdscopeError

    assert grpo_config(inputs, vllm_mode="server").vllm_mode == "server"
    with pytest.raises(CdscopeError, match="GRPOConfig refused"):
        grpo_config(inputs, no_such_option=1)
    for key, value in (("gradient_checkpointing", True), ("gradient_checkpointing_kwargs", {})):
        with pytest.raises(CdscopeError, match="--activation-checkpointing"):
            grpo_config(inputs, **{key: value})
    if not torch.cuda.is_available():
        with pytest.raises(CdscopeError, match="vLLM rollouts need CUDA GPUs") as caught:
            grpo_config(inputs, use_vllm=True, vllm_mode="colocate")
        assert "\n" not in str(caught.value)


def test_the_grpo_options_reach_trl_and_are_not_set_twice(inputs) -> None:
    """--loss-type & co. are cdscope options passed to GRPOConfig; --trl-arg cannot set them
    behind the validation's back, and Liger's loss is refused under CD-RFT (issue 40 item 7)."""
    from cdscope.errors import CdscopeError

    cfg = inputs.cfg.replace(
        loss_type="dr_grpo", scale_rewards="none", clip_eps=0.1, epsilon_high=0.3,
        num_iterations=2, mask_truncated_completions=True, log_completions=True, backend="trl",
    )  # fmt: skip
    cfg.validate()
    got = grpo_config(dataclasses.replace(inputs, cfg=cfg))
    assert (got.loss_type, got.scale_rewards, got.epsilon, got.epsilon_high) == (
        "dr_grpo", "none", 0.1, 0.3,
    )  # fmt: skip
    assert (got.num_iterations, got.mask_truncated_completions, got.log_completions) == (2, 1, 1)
    for key, flag in (("loss_type", "--loss-type"), ("epsilon_high", "--epsilon-high"),
                      ("beta", "--beta"), ("num_iterations", "--num-iterations")):  # fmt: skip
        with pytest.raises(CdscopeError, match=f"set it with {flag}"):
            grpo_config(inputs, **{key: "x"})
    with pytest.raises(CdscopeError, match="use_liger_kernel=true with --regularizer cdrft") as e:
        grpo_config(inputs, use_liger_kernel="true")
    assert "\n" not in str(e.value)
    plain = dataclasses.replace(inputs, cfg=inputs.cfg.replace(regularizer="none"))
    assert grpo_config(plain, use_liger_kernel=False).use_liger_kernel is False


def test_activation_checkpointing_through_trl_takes_the_same_step(tmp_path: Path) -> None:
    """--activation-checkpointing on the TRL route is transformers' non-reentrant
    checkpointing (the Trainer trains in training mode); one CD-RFT step with it gives the
    weights of the same step without it."""
    files = {
        "tasks": write_tasks_file(tmp_path / "tasks.jsonl"),
        "pool": write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }
    weights = []
    for on in (False, True):
        cfg = config(
            files, tmp_path / f"run-{on}", steps=1, temperature=1.0, micro_batch_size=2,
            estimator="folded", activation_checkpointing=on,
        )  # fmt: skip
        inputs = prepare(cfg, None, tiny_model("llama", "eager"), byte_tokenizer(), parity_reward)
        args = grpo_config(inputs)
        assert args.gradient_checkpointing is on
        assert args.gradient_checkpointing_kwargs == {"use_reentrant": False}
        train_with_trl(inputs)
        assert inputs.model.is_gradient_checkpointing is on
        weights.append({k: v.clone() for k, v in inputs.model.state_dict().items()})
    start = tiny_model("llama", "eager").state_dict()
    update = max(float((weights[0][k] - start[k]).abs().max()) for k in start)
    diff = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in start)
    assert update > 1e-4 and diff <= 1e-6 * update  # measured bit for bit (0.0)


def test_resume_keeps_the_log_of_checkpointed_steps(tmp_path: Path) -> None:
    """A run interrupted after step 1 (checkpoint-1 kept, step 2 logged but not saved)
    resumes at step 2: the log holds steps 1 and 2 once each, and a fresh start is refused."""
    import shutil

    from cdscope.errors import CdscopeError

    files = {
        "tasks": write_tasks_file(tmp_path / "tasks.jsonl"),
        "pool": write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }
    cfg = config(files, tmp_path / "run", steps=2, save_every=1, micro_batch_size=2)

    def fresh():
        return prepare(cfg, None, tiny_model("llama", "sdpa"), byte_tokenizer(), parity_reward)

    first = train_with_trl(fresh())
    assert list(first.log["step"]) == [1, 2] and first.resumed_from is None
    trl_dir = Path(cfg.out_dir) / "trl"
    shutil.rmtree(trl_dir / "checkpoint-2")  # as if the run died before saving step 2
    with pytest.raises(CdscopeError, match="already holds a TRL run"):
        train_with_trl(fresh())
    second = train_with_trl(fresh(), resume=True)
    assert second.resumed_from == 1 and second.steps_done == 2
    log = pd.read_parquet(Path(cfg.out_dir) / "log.parquet")
    assert list(log["step"]) == [1, 2]
    assert log["b_shared_before"].iloc[0] == first.log["b_shared_before"].iloc[0]


@pytest.mark.parametrize(
    ("completions", "micro", "world", "expected"),
    [
        (32, 4, 1, (4, 8)),
        (32, 4, 8, (4, 1)),
        (32, 8, 2, (8, 2)),
        (6, 4, 1, (3, 2)),
        (12, 4, 4, (3, 1)),
    ],
)
def test_one_optimizer_step_is_prompts_times_group_over_all_processes(
    completions: int, micro: int, world: int, expected: tuple[int, int]
) -> None:
    from cdscope.integrations.trl import per_rank_batches

    per_device, accumulation = per_rank_batches(completions, micro, world)
    assert (per_device, accumulation) == expected
    assert per_device * accumulation * world == completions


def test_completions_that_do_not_split_over_processes_are_refused() -> None:
    from cdscope.errors import CdscopeError
    from cdscope.integrations.trl import per_rank_batches

    with pytest.raises(CdscopeError, match="cannot be split over 3 processes"):
        per_rank_batches(32, 4, 3)


def test_a_diverging_step_stops_the_trl_run_naming_its_last_checkpoint(
    tmp_path: Path, monkeypatch
) -> None:
    """The shared step's finite check, reached from TRL's hook: one line, TRL's checkpoint."""
    from cdscope.errors import CdscopeError
    from cdscope.train.step import CDRFTStep

    files = {
        "tasks": write_tasks_file(tmp_path / "tasks.jsonl"),
        "pool": write_pool(tmp_path / "pool.jsonl", {"math": 4, "code": 4, "logic": 4}),
    }
    cfg = config(files, tmp_path / "run", steps=3, save_every=1, micro_batch_size=6)
    real = CDRFTStep.before_update

    def poisoned(self, step, *args, **kwargs):
        if step == 2:  # a NaN backbone gradient at step 2
            next(p for p in self.params if p.grad is not None).grad.fill_(float("nan"))
        return real(self, step, *args, **kwargs)

    monkeypatch.setattr(CDRFTStep, "before_update", poisoned)
    inputs = prepare(cfg, None, tiny_model("llama", "sdpa"), byte_tokenizer(), parity_reward)
    with pytest.raises(CdscopeError, match=r"diverged at step 2: the gradient .*checkpoint-1\b"):
        train_with_trl(inputs)
    assert list(pd.read_parquet(Path(cfg.out_dir) / "log.parquet")["step"]) == [1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_vllm_rollouts_without_cuda_are_one_line_before_the_model_loads(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from tests.helpers import invoke

    result = invoke(  # a real model, refused before it loads (a missing one is refused first)
        "train", "--backend", "trl", "--trl-arg", "use_vllm=true", "--trl-arg",
        "vllm_mode=colocate", "--model", tiny_model_dir, "-o", tmp_path / "run",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "vLLM rollouts need CUDA GPUs" in result.output
    assert len(result.output.strip().splitlines()) == 1
