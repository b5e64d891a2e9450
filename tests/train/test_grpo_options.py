"""The GRPO options GRPO users set daily, in the hf loop (issue 40 item 7): --loss-type,
--scale-rewards, --epsilon / --epsilon-high, --mask-truncated-completions,
--log-completions, and --num-iterations refused where the loop does not implement it.

Each loss normaliser is checked against its formula written out over the whole batch
(the slow twin: one padded forward of every row, TRL's expressions), through the lean
step and the plain step, in micro-batches that split groups; tests/train/test_trl.py checks
the same weights against TRL's own ``_compute_loss``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cdscope.commands.train import run_train
from cdscope.core.generation import eos_token_ids, sample
from cdscope.errors import CdscopeError
from cdscope.train.grpo import (
    backbone_backward,
    completion_logprobs,
    group_advantages,
    per_token_loss,
    token_weights,
)
from tests.helpers import (
    byte_tokenizer,
    config,
    invoke,
    parity_reward,
    refused,
    tiny_model,
    train_files,
)

REWARDS = torch.tensor([1.0, 0, 0, 1, 0.5, 0.5, 0.5, 0.5, 0, 0, 0, 1])
MAX_NEW = 9


def test_reward_scales_against_their_formulas() -> None:
    r = np.array([1.0, 0, 0.25, 1, 0.5, 0.5, 0.5, 0.5, 0, 0, 0, 1])
    groups = r.reshape(3, 4)
    centred = (groups - groups.mean(1, keepdims=True)).ravel()
    expected = {
        "group": centred / (np.repeat(groups.std(1, ddof=1), 4) + 1e-4),
        "batch": centred / (r.std(ddof=1) + 1e-4),
        "none": centred,
    }
    for scale, want in expected.items():
        got = group_advantages(torch.tensor(r, dtype=torch.float32), 4, scale).double().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="unknown reward scale"):
        group_advantages(torch.tensor(r), 4, "std")


def _twin_loss(model, r, mask, adv, loss_type: str) -> torch.Tensor:  # noqa: ANN001
    """TRL's expressions on the whole batch at once (one padded forward)."""
    logp = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, mask)
    loss_t, _ = per_token_loss(logp, logp.detach(), adv)
    m = mask.to(loss_t.dtype)
    if loss_type in ("dapo", "bnpo"):
        return (loss_t * m).sum() / m.sum()
    if loss_type == "grpo":
        return ((loss_t * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    return (loss_t * m).sum() / (loss_t.shape[0] * MAX_NEW)  # dr_grpo


def _grads(model) -> torch.Tensor:  # noqa: ANN001
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo", "bnpo"])
def test_every_loss_type_equals_its_whole_batch_formula(loss_type: str) -> None:
    model = tiny_model("llama", "eager")
    r = sample(model, byte_tokenizer(), ["ab", "hello there", "xyz q"], num_samples=4,
               max_new_tokens=MAX_NEW, temperature=1.0, seed=3)  # fmt: skip
    mask = r.completion_mask.clone()
    mask[1, 4:] = False  # unequal lengths: grpo's per-row mean differs from dapo's
    mask[6, 2:] = False
    adv = group_advantages(REWARDS, 4)
    model.zero_grad(set_to_none=True)
    _twin_loss(model, r, mask, adv, loss_type).backward()
    want = _grads(model)
    weights = token_weights(mask, loss_type, MAX_NEW)
    for plain in (False, True):
        model.zero_grad(set_to_none=True)
        backbone_backward(
            model, r.prompt_ids, r.prompt_mask, r.completion_ids, mask, adv,
            weights=weights, micro_batch_size=5, plain=plain,
        )  # fmt: skip
        got = _grads(model)
        assert float((got - want).abs().max() / want.abs().max()) < 1e-5, (loss_type, plain)
    # the normalisers differ, so the check can fail: dapo's weights under grpo's formula
    if loss_type == "grpo":
        model.zero_grad(set_to_none=True)
        backbone_backward(model, r.prompt_ids, r.prompt_mask, r.completion_ids, mask, adv,
                          weights=token_weights(mask, "dapo"), micro_batch_size=5)  # fmt: skip
        assert float((_grads(model) - want).abs().max() / want.abs().max()) > 1e-2


def test_asymmetric_clip_bounds_the_ratio_on_each_side() -> None:
    logp = torch.zeros(1, 4, requires_grad=True)
    old = torch.log(torch.tensor([[0.5, 0.9, 1.1, 2.0]]))  # ratios 2, 1.11, 0.91, 0.5
    loss, _ = per_token_loss(logp, old, torch.tensor([1.0]), 0.2, clip_high=0.28)
    ratio = torch.exp(-old)
    # A > 0: -min(rho A, clip(rho) A) = -min(rho, clip(rho)) -> the upper bound acts at 1.28
    want = -torch.minimum(ratio, ratio.clamp(0.8, 1.28))
    torch.testing.assert_close(loss, want)
    assert float(loss.detach()[0, 0]) == pytest.approx(-1.28)


def test_truncated_rows_are_those_without_an_eos() -> None:
    model, tokenizer = tiny_model("llama", "eager"), byte_tokenizer()
    r = sample(model, tokenizer, ["ab", "hello"], num_samples=6, max_new_tokens=4,
               temperature=1.5, seed=0)  # fmt: skip
    eos = torch.tensor(eos_token_ids(model, tokenizer))
    has_eos = torch.isin(r.completion_ids, eos).any(dim=1) & r.completion_mask.any(dim=1)
    assert torch.equal(r.truncated, ~has_eos)
    assert bool(r.truncated.any())  # 4 tokens of a random byte model: most hit the cap
    assert bool(r.completion_mask[r.truncated].all())  # a cut row fills the whole width


def test_log_completions_and_masked_truncation_through_a_resumed_run(tmp_path: Path) -> None:
    files = train_files(tmp_path)
    cfg = config(files, tmp_path / "run", steps=2, save_every=1, regularizer="none",
                 log_completions=True, mask_truncated_completions=True, max_new_tokens=3,
                 temperature=1.5)  # fmt: skip
    run = {"tokenizer": byte_tokenizer(), "reward_fn": parity_reward}
    run_train(cfg, model=tiny_model("llama", "sdpa"), stop_after=1, **run)
    result = run_train(cfg, model=tiny_model("llama", "sdpa"), resume=True, **run)
    rows = pd.read_parquet(tmp_path / "run" / "completions.parquet")
    log = result.log.set_index("step")
    assert list(rows.groupby("step").size()) == [6, 6]  # 3 prompts x 2, each step once
    assert set(rows["sample"]) == {0, 1}
    for step, part in rows.groupby("step"):
        assert part["reward"].mean() == pytest.approx(log.loc[step, "reward"])
        # the loss's tokens are the rows that ended with an EOS
        assert log.loc[step, "completion_tokens"] == part.loc[~part["truncated"],
                                                             "generated_tokens"].sum()  # fmt: skip
        adv = group_advantages(torch.tensor(part["reward"].to_numpy()), 2)
        np.testing.assert_allclose(part["advantage"], adv.double().numpy(), rtol=1e-6)
    assert rows["truncated"].any()


def test_options_the_hf_loop_cannot_honour_are_refused(tmp_path: Path) -> None:
    cfg = config(train_files(tmp_path), tmp_path / "run")
    for changes, words in (
        ({"loss_type": "sapo"}, "--loss-type must be one of dapo | grpo | dr_grpo | bnpo"),
        ({"scale_rewards": "std"}, "--scale-rewards must be one of group | batch | none"),
        ({"clip_eps": 1.5}, "--epsilon must lie in (0, 1)"),
        ({"clip_eps": float("nan")}, "--epsilon must be a finite number"),
        ({"epsilon_high": -0.1}, "--epsilon-high must be positive"),
        ({"num_iterations": 2}, "--num-iterations above 1"),
    ):
        with pytest.raises(CdscopeError, match=words.replace("(", r"\(").replace(")", r"\)")):
            cfg.replace(**changes).validate()
    cfg.replace(num_iterations=2, backend="trl").validate()  # TRL reuses its batches


def test_cli_spells_the_options_as_trl_does(tmp_path: Path) -> None:
    files = train_files(tmp_path)
    base = ("train", "--tasks", files["tasks"], "--probe", files["pool"], "-o", tmp_path / "r")
    refused(invoke(*base, "--loss-type", "gspo"), "--loss-type", "dapo | grpo")
    refused(invoke(*base, "--num-iterations", "3"), "--num-iterations", "--backend trl")
    help_text = invoke("train", "--help").output
    for flag in ("--loss-type", "--scale-rewards", "--epsilon-high", "--num-iterations",
                 "--mask-truncated-completions", "--log-completions"):  # fmt: skip
        assert flag in help_text
