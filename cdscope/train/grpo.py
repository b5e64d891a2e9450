"""The GRPO backbone loss (SPEC §5 "GRPO loss"): advantages, token log-probs, clipped surrogate.

For G completions o_1..o_G of one prompt with rewards r_i,

    A_i   = (r_i - mean_j r_j) / (std_j r_j + 1e-4)          (std with ddof = 1, as TRL)
    rho   = exp(logp - logp_old)                             per completion token
    l_t   = -min(rho A_i, clip(rho, 1 - clip_eps, 1 + clip_eps) A_i) + beta * KL_t
    KL_t  = exp(ref - logp) - (ref - logp) - 1               (k3 estimator, frozen reference)
    loss  = sum over all completion tokens of the step of l_t / (number of those tokens)

"Mean over completion tokens" is taken over every completion token of the optimizer
step (TRL's ``loss_type="dapo"`` / ``"bnpo"`` on a single batch), so a micro-batch's
share is its token sum divided by the step's token count: gradient accumulation over
micro-batches gives exactly the full-batch gradient, whatever the split. With one
policy update per batch, logp_old = logp.detach() and rho = 1 in value, but the
general form is kept so the gradient is the clipped-surrogate one.

Token log-probs: prompts are left-padded, completions right-padded, so
``prompt ++ completion`` keeps every completion token in the last T positions; the
logits are computed only there (``logits_to_keep``), with position ids counted over real
tokens (the same positions ``generate`` used), and log-softmax in fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

ADV_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Group-normalised advantages of ``rewards`` [N] (groups of ``group_size`` consecutive rows)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.double().view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    return ((grouped - mean) / (std + ADV_EPS)).view(-1).to(torch.float32)


def completion_logprobs(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
) -> torch.Tensor:
    """log pi(o_t | x, o_<t) for every completion position: ``[N, T]`` fp32 (padding included)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()
    # Positions over real tokens; pads after EOS just continue counting (they are masked).
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp_min(0)
    real_prompt_end = prompt_mask.long().sum(dim=1, keepdim=True)
    T = completion_ids.shape[1]  # noqa: N806
    position_ids[:, -T:] = real_prompt_end + torch.arange(T, device=input_ids.device)
    attention_mask[:, -T:] = 1  # completion pads never influence earlier, scored positions
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=T + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()  # positions P-1 .. P+T-2 predict completion tokens
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids[..., None]).squeeze(-1)


def per_token_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float = 0.2,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Clipped surrogate (+ beta k3 KL) per token: ``[N, T]``, and the KL ``[N, T]`` (or None)."""
    ratio = torch.exp(logp - logp_old)
    adv = advantages[:, None].to(logp.dtype)
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps)
    loss = -torch.min(ratio * adv, clipped * adv)
    kl = None
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("beta > 0 needs the reference model's log-probs")
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1
        loss = loss + beta * kl
    return loss, kl


def masked_token_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask.to(values.dtype)).sum()


@dataclass
class BackboneStats:
    loss: float  # the step's GRPO loss (token mean)
    kl: float  # mean k3 KL over completion tokens (0 when beta = 0)
    tokens: int
    seconds: float = 0.0


LogprobFn = Callable[..., torch.Tensor]


def backbone_backward(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    beta: float = 0.0,
    ref_model: nn.Module | None = None,
    micro_batch_size: int | None = None,
    share: slice = slice(None),
    scale: float = 1.0,
) -> BackboneStats:
    """Accumulate grad of the step's GRPO loss into ``.grad``, micro-batch by micro-batch.

    Each micro-batch contributes (its token sum of l_t) / (the step's token count), so the
    accumulated gradient equals the full-batch gradient exactly (up to float summation).
    Completions with no generated token (empty mask) contribute nothing.

    ``share``: the rows this process backpropagates (a sharded run's rank: its 1/W of the
    completions), normalised by the token count of *all* rows; ``scale`` multiplies what
    is backpropagated (W under FSDP, whose reduce-scatter takes the mean over ranks). The
    returned loss / KL are this share's parts of the step's (unscaled).
    """
    device = next(model.parameters()).device
    N = completion_ids.shape[0]  # noqa: N806
    total_tokens = int(completion_mask.sum())
    if total_tokens == 0:
        return BackboneStats(0.0, 0.0, 0)
    loss_sum = 0.0
    kl_sum = 0.0
    mine = torch.arange(N)[share]
    for rows in torch.split(mine, micro_batch_size or max(len(mine), 1)):
        tensors = [
            t[rows].to(device) for t in (prompt_ids, prompt_mask, completion_ids, completion_mask)
        ]
        p_ids, p_mask, c_ids, c_mask = _trim(*tensors)
        logp = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask)
        ref = None
        if beta != 0.0:
            if ref_model is None:
                raise ValueError("beta > 0 needs a reference model")
            with torch.no_grad():
                ref = completion_logprobs(ref_model, p_ids, p_mask, c_ids, c_mask)
        loss_t, kl_t = per_token_loss(
            logp, logp.detach(), advantages[rows].to(device), clip_eps, beta, ref
        )
        loss = masked_token_sum(loss_t, c_mask) / total_tokens
        if loss.requires_grad:
            (loss * scale if scale != 1.0 else loss).backward()
        loss_sum += float(loss.detach())
        if kl_t is not None:
            kl_sum += float(masked_token_sum(kl_t.detach(), c_mask)) / total_tokens
    return BackboneStats(loss_sum, kl_sum, total_tokens)


def _trim(
    p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor, c_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop all-pad prompt columns on the left and all-pad completion columns on the right."""
    keep_p = int(p_mask.long().sum(dim=1).max())
    keep_c = max(int(c_mask.long().sum(dim=1).max()), 1)
    return p_ids[:, -keep_p:], p_mask[:, -keep_p:], c_ids[:, :keep_c], c_mask[:, :keep_c]
