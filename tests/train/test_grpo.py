"""GRPO backbone (SPEC §5): advantages, token log-probs, loss and gradient vs slow twins and TRL."""

from __future__ import annotations

import pytest
import torch

from cdscope.core.generation import sample
from cdscope.train.grpo import (
    backbone_backward,
    completion_logprobs,
    group_advantages,
    per_token_loss,
)
from tests.helpers import byte_tokenizer, per_sample_grpo_grads, tiny_model


def test_group_advantages_formula() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])
    adv = group_advantages(rewards, 4)
    for g in range(3):
        r = rewards[4 * g : 4 * g + 4].double()
        std = float(r.std()) if r.std() > 0 else 0.0  # ddof = 1
        expected = (r - r.mean()) / (std + 1e-4)
        torch.testing.assert_close(adv[4 * g : 4 * g + 4].double(), expected, rtol=1e-6, atol=1e-6)
    assert torch.all(adv[4:8] == 0)  # a group with equal rewards teaches nothing
    with pytest.raises(ValueError):
        group_advantages(rewards, 5)


def test_per_token_loss_clips_and_k3() -> None:
    logp = torch.tensor([[-1.0, -2.0]])
    old = torch.tensor([[-1.5, -1.0]])  # ratios e^0.5 (clipped for A > 0) and e^-1
    adv = torch.tensor([2.0])
    loss, kl = per_token_loss(logp, old, adv, 0.2, beta=0.1, ref_logp=torch.tensor([[-1.0, -1.0]]))
    ratio = torch.exp(logp - old)
    surrogate = -torch.minimum(ratio * 2.0, ratio.clamp(0.8, 1.2) * 2.0)
    k3 = torch.exp(torch.tensor([[0.0, 1.0]])) - torch.tensor([[0.0, 1.0]]) - 1
    torch.testing.assert_close(kl, k3)
    torch.testing.assert_close(loss, surrogate + 0.1 * k3)
    assert float(surrogate[0, 0]) == pytest.approx(-2.4)  # clip(e^0.5) = 1.2


@pytest.fixture(scope="module")
def rollouts():
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    prompts = ["ab", "hello there", "xyz q"]  # different lengths: real left padding
    r = sample(
        model, byte_tokenizer(), prompts, num_samples=4, max_new_tokens=9, temperature=1.0, seed=3
    )
    r.completion_mask[1, 4:] = False  # an early EOS: pad after it, masked out
    r.completion_mask[6, 2:] = False
    return model, r


@pytest.mark.parametrize("plain", [True, False])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_backbone_gradient_matches_per_sample_twin(rollouts, beta: float, plain: bool) -> None:
    """Both steps against the per-sample loop: the plain step forwards the same whole
    sequences (to 1e-8), the lean one shares the prompt's cache and skips zero-advantage
    rows, whose different float64 sums round differently into the fp32 log-softmax
    (measured over 7 architectures x 2 kernels: at most 2.4e-7 of the largest entry)."""
    model, r = rollouts
    # group 2's rewards are equal: advantages 0, its rows skipped by the lean step at beta 0
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1]), 4)
    ref = tiny_model("llama", "sdpa", dtype=torch.float64, seed=1) if beta else None
    twin = per_sample_grpo_grads(model, r, adv, beta, ref)
    model.zero_grad(set_to_none=True)
    stats = backbone_backward(
        model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, adv,
        beta=beta, ref_model=ref, micro_batch_size=5, plain=plain,
    )  # fmt: skip
    assert stats.tokens == int(r.completion_mask.sum())
    assert stats.path == ("plain" if plain else "shared-prompt")
    assert stats.skipped == (4 if beta == 0 and not plain else 0)  # group 2's advantages are 0
    fast = torch.cat([p.grad.flatten() for p in model.parameters()])
    slow = torch.cat([g.flatten() for g in twin])
    assert float(slow.norm()) > 1e-3  # the check is not vacuous
    floor = 1e-8 if plain else 1e-6
    assert float((fast - slow).abs().max()) <= floor * float(slow.abs().max())
    if beta:
        assert stats.kl > 0


def test_micro_batching_is_exact(rollouts) -> None:
    model, r = rollouts
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 1, 0, 0, 0, 1]), 4)
    grads = []
    for mb in (None, 1, 5):
        model.zero_grad(set_to_none=True)
        backbone_backward(
            model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, adv,
            micro_batch_size=mb, plain=True,
        )  # fmt: skip
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(grads[2], grads[0], rtol=1e-9, atol=1e-12)


def test_padded_logprobs_equal_unpadded(rollouts) -> None:
    model, r = rollouts
    with torch.no_grad():
        batched = completion_logprobs(
            model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask
        )
        for i in (0, 5, 9):
            prompt = r.prompt_ids[i][r.prompt_mask[i]]
            ids = torch.cat([prompt, r.completion_ids[i]])[None]
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            single = torch.log_softmax(logits, -1).gather(-1, r.completion_ids[i][:, None])
            n = int(r.completion_mask[i].sum())
            torch.testing.assert_close(batched[i, :n], single.squeeze(-1)[:n], rtol=0, atol=1e-10)
