"""The lean GRPO step (train/grpo.py) against its slow twins (issue 35, part 1).

* the backbone gradient of the lean step -- zero-advantage rows skipped, each prompt run
  once per group with its cache repeated over the rows -- equals the per-sample loop's and
  the plain step's on every architecture whose prompt cache is exact, to the floor that
  fp32 log-softmax sets (measured: at most 2.4e-7 of the largest entry);
* where the cache is not exact (Mamba's recurrent state) or blocks rerun in the backward
  (activation checkpointing) the per-row path takes over, bucketed by length, same gradient;
* a step whose rows would all be skipped gives the optimizer the plain step's zeros;
* generation with a shared prefill samples the same completions as per-row prefill;
* the checks can fail: a shared-prompt pass that drops the cache breaks the parity.
"""

from __future__ import annotations

import pytest
import torch

from cdscope.core import generation
from cdscope.core.generation import prompt_cache_is_exact, sample
from cdscope.settings.training import TrainConfig
from cdscope.tools.tiny import tiny_model as any_tiny_model
from cdscope.train import grpo
from cdscope.train.engine import checkpoint_blocks
from cdscope.train.grpo import backbone_backward, group_advantages
from tests.helpers import ARCHS, byte_tokenizer, per_sample_grpo_grads, tiny_model

PROMPTS = ["ab", "hello there", "xyz q"]  # unequal lengths: real left padding in the plain step
#: group 2's rewards are equal: advantage 0, its 4 rows skipped at beta = 0
REWARDS = torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1])
#: lean vs per-sample twin, relative to the largest gradient entry: fp32 log-softmax of
#: float64 logits summed in another order (measured <= 2.4e-7 over the archs below)
FLOOR = 1e-6


def _rollouts(model):  # noqa: ANN001, ANN202
    r = sample(
        model, byte_tokenizer(), PROMPTS, num_samples=4, max_new_tokens=9, temperature=1.0, seed=3
    )
    r.completion_mask[1, 4:] = False  # an early EOS
    r.completion_mask[9, :] = False  # a completion with no token at all
    return r


def _grad(model, r, adv, **kwargs):  # noqa: ANN001, ANN202
    model.zero_grad(set_to_none=True)
    stats = backbone_backward(
        model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, adv,
        micro_batch_size=5, **kwargs,
    )  # fmt: skip
    return torch.cat([p.grad.flatten() for p in model.parameters()]), stats


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("beta", [0.0, 0.05])
@pytest.mark.parametrize("arch", ARCHS)
def test_lean_step_gradient_equals_the_per_sample_loop(arch: str, beta: float) -> None:
    model = tiny_model(arch, "sdpa", dtype=torch.float64)
    ref = tiny_model(arch, "sdpa", dtype=torch.float64, seed=1) if beta else None
    r = _rollouts(model)
    adv = group_advantages(REWARDS, 4)
    twin = torch.cat([g.flatten() for g in per_sample_grpo_grads(model, r, adv, beta, ref)])
    lean, stats = _grad(model, r, adv, beta=beta, ref_model=ref)
    assert stats.path == "shared-prompt"  # the cache of every architecture here is exact
    # beta = 0: group 2 (advantage 0) and the empty row 9; beta > 0 needs every row's KL
    assert stats.skipped == (5 if beta == 0 else 1) and stats.rows == 12
    assert float(twin.norm()) > 1e-3
    assert _relative(lean, twin) <= FLOOR


def test_lean_and_plain_steps_agree_with_left_padding_under_sdpa() -> None:
    model = tiny_model("qwen2", "sdpa", dtype=torch.float64)
    r = _rollouts(model)
    adv = group_advantages(REWARDS, 4)
    plain, plain_stats = _grad(model, r, adv, plain=True)
    lean, lean_stats = _grad(model, r, adv)
    assert plain_stats.path == "plain" and plain_stats.skipped == 0
    assert _relative(lean, plain) <= FLOOR
    assert lean_stats.loss == pytest.approx(plain_stats.loss, rel=1e-6)


@pytest.mark.parametrize("model_type", ["mamba", "mixtral", "phi3", "gpt_bigcode"])
def test_other_architectures_pick_their_path_and_keep_the_gradient(model_type: str) -> None:
    """Mamba's recurrent state is no KV cache: the per-row path; MoE and multi-query
    attention share the prompt like the rest."""
    model = any_tiny_model(model_type).double()
    r = _rollouts(model)
    adv = group_advantages(REWARDS, 4)
    twin = [g for g in per_sample_grpo_grads(model, r, adv, 0.0, None)]
    lean, stats = _grad(model, r, adv)
    assert stats.path == ("per-row" if model_type == "mamba" else "shared-prompt")
    assert _relative(lean, torch.cat([g.flatten() for g in twin])) <= FLOOR


def test_activation_checkpointing_takes_the_bucketed_per_row_path() -> None:
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    r = _rollouts(model)
    adv = group_advantages(REWARDS, 4)
    twin = torch.cat([g.flatten() for g in per_sample_grpo_grads(model, r, adv, 0.0, None)])
    checkpoint_blocks(model)
    lean, stats = _grad(model, r, adv)
    assert stats.path == "per-row"
    assert _relative(lean, twin) <= FLOOR


def test_per_row_chunks_are_bucketed_by_length(monkeypatch) -> None:
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    r = _rollouts(model)
    monkeypatch.setattr(grpo, "prompt_cache_is_exact", lambda model, device: False)
    adv = group_advantages(torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 1, 0, 1, 0, 1]), 4)
    lengths = r.prompt_mask.sum(1) + r.completion_mask.sum(1)
    chunks, path, skipped = grpo._lean_chunks(
        model, r.prompt_ids, r.prompt_mask, r.completion_mask, adv, torch.arange(12), 5, 0.0
    )
    assert path == "per-row" and skipped == 1  # row 9 has no token
    order = torch.cat([rows for rows, _ in chunks])
    assert sorted(order.tolist()) == [i for i in range(12) if i != 9]
    assert lengths[order].tolist() == sorted(lengths[order].tolist(), reverse=True)


def test_a_step_with_nothing_to_learn_gives_the_plain_zeros() -> None:
    """Every advantage 0: the plain step backpropagates zeros, so AdamW still decays its
    moments; the lean step must give the same zero gradient, not none."""
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    r = _rollouts(model)
    adv = torch.zeros(12)
    plain, _ = _grad(model, r, adv, plain=True)
    lean, stats = _grad(model, r, adv)
    assert stats.skipped == 12 and stats.skipped_fraction == 1.0
    assert torch.equal(plain, torch.zeros_like(plain)) and torch.equal(lean, plain)
    assert all(p.grad is not None for p in model.parameters())


def test_the_parity_check_fails_on_a_prompt_pass_without_the_cache(monkeypatch) -> None:
    model = tiny_model("llama", "sdpa", dtype=torch.float64)
    r = _rollouts(model)
    adv = group_advantages(REWARDS, 4)
    twin = torch.cat([g.flatten() for g in per_sample_grpo_grads(model, r, adv, 0.0, None)])

    def forgetful(model, prompt, completion_ids):  # noqa: ANN001, ANN202
        out = model(input_ids=prompt, logits_to_keep=1)  # the completions never see the prompt
        first = torch.log_softmax(out.logits[:, -1].float(), -1)[0, completion_ids[:, 0]]
        rest = model(input_ids=completion_ids[:, :-1]).logits.float()
        tail = torch.log_softmax(rest, -1).gather(-1, completion_ids[:, 1:, None]).squeeze(-1)
        return torch.cat([first[:, None], tail], dim=1)

    monkeypatch.setattr(grpo, "shared_prompt_logprobs", forgetful)
    broken, _ = _grad(model, r, adv)
    assert _relative(broken, twin) > 100 * FLOOR


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("arch", ARCHS)
def test_shared_prefill_samples_the_same_completions(arch: str, attn: str) -> None:
    model = tiny_model(arch, attn)
    tokenizer = byte_tokenizer()
    for temperature in (0.0, 1.0):
        runs = [
            sample(
                model,
                tokenizer,
                [*PROMPTS, "a longer prompt here"],
                num_samples=3,
                max_new_tokens=8,
                temperature=temperature,
                seed=1,
                share_prefill=shared,
            )  # fmt: skip
            for shared in (True, False)
        ]
        assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
        assert torch.equal(runs[0].prompt_ids, runs[1].prompt_ids)
        assert runs[0].texts == runs[1].texts


def test_shared_prefill_is_used_where_exact_and_prefills_once(monkeypatch) -> None:
    model = tiny_model("llama", "sdpa")
    calls: list[int] = []
    real = generation._prefill

    def counting(model, input_ids, attention, repeats):  # noqa: ANN001, ANN202
        calls.append(repeats)
        return real(model, input_ids, attention, repeats)

    monkeypatch.setattr(generation, "_prefill", counting)
    sample(model, byte_tokenizer(), PROMPTS, num_samples=4, max_new_tokens=3, temperature=1.0,
           seed=0, batch_size=8)  # fmt: skip
    assert calls == [4, 4]  # 2 prompts (8 rows) per generate call, then 1: each prefilled once
    calls.clear()
    sample(model, byte_tokenizer(), PROMPTS, num_samples=4, max_new_tokens=3, temperature=1.0,
           seed=0, share_prefill=False)  # fmt: skip
    assert calls == [1]


def test_prompt_cache_check_refuses_dropout_and_foreign_caches() -> None:
    cpu = torch.device("cpu")
    model = tiny_model("llama", "sdpa")
    assert prompt_cache_is_exact(model, cpu)
    model.config.attention_dropout = 0.1
    assert prompt_cache_is_exact(model, cpu)  # eval mode: no dropout is drawn
    model.train()
    assert not prompt_cache_is_exact(model, cpu)
    assert not prompt_cache_is_exact(any_tiny_model("mamba"), cpu)


def test_plain_step_is_a_resume_setting() -> None:
    from cdscope.train.checkpoint import RESUME_FIXED

    assert "plain_step" in RESUME_FIXED and TrainConfig().plain_step is False
