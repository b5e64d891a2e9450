"""The GRPO backbone loss (SPEC §5 "GRPO loss"): advantages, token log-probs, clipped surrogate.

For G completions o_1..o_G of one prompt with rewards r_i,

    A_i   = (r_i - mean_j r_j) / (std_j r_j + 1e-4)          (std with ddof = 1, as TRL)
    rho   = exp(logp - logp_old)                             per completion token
    l_t   = -min(rho A_i, clip(rho, 1 - eps, 1 + eps_high) A_i) + beta * KL_t
    KL_t  = exp(ref - logp) - (ref - logp) - 1               (k3 estimator, frozen reference)
    loss  = sum_i w_i * sum over o_i's completion tokens of l_t

with the normaliser w_i of ``--loss-type`` (TRL's ``loss_type``, ``token_weights``), over
the N completions of the optimizer step with |o_i| tokens each:

* ``dapo`` (default): w_i = 1 / sum_j |o_j| -- the mean over every completion token of
  the step; ``bnpo`` (TRL: the local batch's token mean) is the same here, where one
  batch is the step;
* ``grpo``: w_i = 1 / (N max(|o_i|, 1)) -- each completion's token mean, averaged;
* ``dr_grpo``: w_i = 1 / (N L) with L = ``--max-new-tokens`` (Dr. GRPO: no length bias).

``--scale-rewards`` (``advantages``): ``group`` divides by the group's std as above,
``batch`` by the std of all N rewards, ``none`` by nothing (r_i - mean_j r_j; Dr. GRPO).
``--mask-truncated-completions`` drops the rows that reached the length cap without an
EOS from the loss and from every normaliser (TRL's rule), before the weights are taken.

A micro-batch's share is its rows' weighted token sums, so gradient accumulation over
micro-batches gives exactly the full-batch gradient, whatever the split. With one
policy update per batch, logp_old = logp.detach() and rho = 1 in value, but the
general form is kept so the gradient is the clipped-surrogate one.

Token log-probs: prompts are left-padded, completions right-padded, so
``prompt ++ completion`` keeps every completion token in the last T positions; the
logits are computed only there (``logits_to_keep``), with position ids counted over real
tokens (the same positions ``generate`` used), and log-softmax in fp32.

**The lean step** (``backbone_backward``'s default; ``plain=True`` is the slow twin, the
step as written above, row by row in the given order). It computes only what moves the
weights, with the same gradient:

* at beta = 0 a row whose advantage is exactly 0 has l_t = -min(rho * 0, clip * 0) = 0 at
  every token and a gradient of exactly 0, so it is not forwarded at all (nor is a row
  with no completion token); the normaliser stays the token count of *all* rows, so the
  gradient is unchanged. With beta > 0 the KL term needs every row and none is skipped.
  (If every row would be skipped, the shortest is still run, at a gradient of exact
  zeros, so the optimizer sees the same zero gradient the plain step gives it.)
* the G rows of a group read one prompt: where a prompt's KV cache is exact
  (``core.generation.prompt_cache_is_exact``: plain and sliding-window attention caches,
  no dropout -- Llama, Mistral, Qwen2/3, Gemma-2, GPT-2, GPT-NeoX measured in tests), the
  prompt is run once per group (one unpadded row, its last position giving the first
  completion token's logits), its cache repeated over the group's rows, and the
  completions (all but their last token) run against it; the backward carries every
  row's gradient into the one prompt pass. Activation checkpointing reruns a block's
  forward in the backward, which would append to the cache twice, so it takes the
  per-row path instead, as does every model whose cache is not exact.
* the per-row path (no shared prompt) forms micro-batches of rows of similar length
  (sorted by prompt + completion length), so no row pays for another's padding.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from cdscope.core.generation import prompt_cache_is_exact
from cdscope.train.engine import blocks_checkpointed

ADV_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group") -> torch.Tensor:
    """Advantages of ``rewards`` [N] (groups of ``group_size`` consecutive rows): minus the
    group mean, divided by the group's std (``scale="group"``), by the std of all N
    rewards (``"batch"``) or by nothing (``"none"``); module docstring."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.double().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale == "none":
        return centred.view(-1).to(torch.float32)
    if scale == "batch":
        std = rewards.double().std() if rewards.numel() > 1 else torch.zeros(())
    elif scale == "group":
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros(())
    else:
        raise ValueError(f"unknown reward scale {scale!r}")
    return (centred / (std + ADV_EPS)).view(-1).to(torch.float32)


def token_weights(
    completion_mask: torch.Tensor, loss_type: str = "dapo", max_new_tokens: int | None = None
) -> torch.Tensor:
    """w_i [N] float64 of the module docstring: row i's tokens enter the loss as w_i times
    their sum. The same for every micro-batch split and for the lean step's skipped rows."""
    lengths = completion_mask.sum(dim=1).double()
    rows = completion_mask.shape[0]
    if loss_type in ("dapo", "bnpo"):
        return torch.full((rows,), 1.0 / max(float(lengths.sum()), 1.0), dtype=torch.float64)
    if loss_type == "grpo":
        return 1.0 / (rows * lengths.clamp_min(1.0))
    if loss_type == "dr_grpo":
        if not max_new_tokens:
            raise ValueError("dr_grpo normalises by max_new_tokens: give it")
        return torch.full((rows,), 1.0 / (rows * max_new_tokens), dtype=torch.float64)
    raise ValueError(f"unknown loss type {loss_type!r}")


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
    clip_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Clipped surrogate (+ beta k3 KL) per token: ``[N, T]``, and the KL ``[N, T]`` (or None).
    The ratio is clipped to [1 - clip_eps, 1 + clip_high] (``clip_high`` default clip_eps)."""
    ratio = torch.exp(logp - logp_old)
    adv = advantages[:, None].to(logp.dtype)
    high = clip_eps if clip_high is None else clip_high
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + high)
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


def weighted_token_sum(
    values: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """sum_i weights_i * sum_t mask_it values_it (``token_weights``)."""
    per_row = (values * mask.to(values.dtype)).sum(dim=1)
    return (per_row * weights.to(per_row.dtype)).sum()


@dataclass
class BackboneStats:
    loss: float  # the step's GRPO loss (token mean)
    kl: float  # mean k3 KL over completion tokens (0 when beta = 0)
    tokens: int
    seconds: float = 0.0
    rows: int = 0  # rows of this share
    skipped: int = 0  # rows not forwarded (zero advantage at beta = 0, or no token)
    path: str = "plain"  # plain | shared-prompt | per-row (the module docstring)

    @property
    def skipped_fraction(self) -> float:
        return self.skipped / self.rows if self.rows else 0.0


def backbone_backward(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_high: float | None = None,
    beta: float = 0.0,
    ref_model: nn.Module | None = None,
    weights: torch.Tensor | None = None,
    micro_batch_size: int | None = None,
    share: slice = slice(None),
    scale: float = 1.0,
    plain: bool = False,
) -> BackboneStats:
    """Accumulate grad of the step's GRPO loss into ``.grad``, micro-batch by micro-batch.

    Each micro-batch contributes its rows' token sums of l_t times their normaliser w_i
    (``weights``, from ``token_weights`` over *all* rows; default ``dapo``: 1 / the step's
    token count), so the accumulated gradient equals the full-batch gradient exactly (up
    to float summation). Completions with no generated token (empty mask) contribute
    nothing; the reported KL is the token mean whatever the weights.

    ``share``: the rows this process backpropagates (a sharded run's rank: its 1/W of the
    completions), weighted over *all* rows; ``scale`` multiplies what
    is backpropagated (W under FSDP, whose reduce-scatter takes the mean over ranks). The
    returned loss / KL are this share's parts of the step's (unscaled).

    ``plain``: the slow twin (every row, in order, ``micro_batch_size`` rows a forward);
    otherwise the lean step of the module docstring.
    """
    if beta != 0.0 and ref_model is None:
        raise ValueError("beta > 0 needs a reference model")
    N = completion_ids.shape[0]  # noqa: N806
    total_tokens = int(completion_mask.sum())
    mine = torch.arange(N)[share]
    if total_tokens == 0:
        return BackboneStats(0.0, 0.0, 0, rows=len(mine))
    if weights is None:
        weights = token_weights(completion_mask)
    size = micro_batch_size or max(len(mine), 1)
    if plain:
        chunks = [(rows, None) for rows in torch.split(mine, size)]
        path, skipped = "plain", 0
    else:
        chunks, path, skipped = _lean_chunks(
            model, prompt_ids, prompt_mask, completion_mask, advantages, mine, size, beta
        )
    device = next(model.parameters()).device
    loss_sum = kl_sum = 0.0
    for rows, prompt in chunks:
        tensors = [
            t[rows].to(device) for t in (prompt_ids, prompt_mask, completion_ids, completion_mask)
        ]
        if prompt is None:
            p_ids, p_mask, c_ids, c_mask = _trim(*tensors)
            logprobs = _padded(p_ids, p_mask, c_ids, c_mask)
        else:
            c_ids, c_mask = _trim_completions(tensors[2], tensors[3])
            logprobs = _shared(prompt.to(device), c_ids)
        logp = logprobs(model)
        ref = None
        if beta != 0.0:
            with torch.no_grad():
                ref = logprobs(ref_model)
        loss_t, kl_t = per_token_loss(
            logp, logp.detach(), advantages[rows].to(device), clip_eps, beta, ref, clip_high
        )
        loss = weighted_token_sum(loss_t, c_mask, weights[rows].to(device))
        if loss.requires_grad:
            (loss * scale if scale != 1.0 else loss).backward()
        loss_sum += float(loss.detach())
        if kl_t is not None:
            kl_sum += float(masked_token_sum(kl_t.detach(), c_mask)) / total_tokens
    return BackboneStats(loss_sum, kl_sum, total_tokens, rows=len(mine), skipped=skipped, path=path)


Chunk = tuple[torch.Tensor, torch.Tensor | None]  # rows, and their shared prompt (or None)


def _lean_chunks(
    model: nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_mask: torch.Tensor,
    advantages: torch.Tensor,
    mine: torch.Tensor,
    size: int,
    beta: float,
) -> tuple[list[Chunk], str, int]:
    """The lean step's forwards: (rows, shared prompt or None) chunks, the path taken and
    the rows skipped (see the module docstring)."""
    lengths = completion_mask.long().sum(dim=1)
    needed = lengths[mine] > 0
    if beta == 0.0:
        needed &= advantages[mine] != 0
    kept = mine[needed]
    if len(kept) == 0:  # the plain step's all-zero gradient: one row of exact zeros
        kept = mine[lengths[mine] > 0][:1] if bool((lengths[mine] > 0).any()) else mine[:1]
    skipped = len(mine) - int(needed.sum())
    device = next(model.parameters()).device
    if not blocks_checkpointed(model) and prompt_cache_is_exact(model, device):
        groups: dict[tuple[int, ...], list[int]] = {}
        for r in kept.tolist():
            groups.setdefault(tuple(prompt_ids[r][prompt_mask[r]].tolist()), []).append(r)
        chunks = [
            (rows, torch.tensor(prompt)[None])
            for prompt, members in groups.items()
            for rows in torch.split(torch.tensor(members), size)
        ]
        return chunks, "shared-prompt", skipped
    total = prompt_mask.long().sum(dim=1) + lengths
    order = kept[torch.argsort(total[kept], descending=True, stable=True)]
    return [(rows, None) for rows in torch.split(order, size)], "per-row", skipped


Logprobs = Callable[[nn.Module], torch.Tensor]


def _padded(
    p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor, c_mask: torch.Tensor
) -> Logprobs:
    """Rows of left-padded prompts + completions, each forwarded whole."""
    return lambda m: completion_logprobs(m, p_ids, p_mask, c_ids, c_mask)


def _shared(prompt: torch.Tensor, c_ids: torch.Tensor) -> Logprobs:
    """One prompt ``[1, P]`` run once, its cache repeated over the rows of ``c_ids``."""
    return lambda m: shared_prompt_logprobs(m, prompt, c_ids)


def shared_prompt_logprobs(
    model: nn.Module, prompt: torch.Tensor, completion_ids: torch.Tensor
) -> torch.Tensor:
    """log pi(o_t | x, o_<t) ``[b, T]`` fp32 for ``b`` completions of ONE prompt ``[1, P]``
    (no padding in the prompt): the prompt's forward gives the first token's logits and
    its KV cache, repeated over the rows, against which the completions' first T - 1
    tokens run (positions P .. P+T-2, counted on from the cache). Exact where
    ``core.generation.prompt_cache_is_exact`` holds."""
    b, T = completion_ids.shape  # noqa: N806
    out = model(input_ids=prompt, use_cache=True, logits_to_keep=1)
    first = torch.log_softmax(out.logits[:, -1].float(), dim=-1)[0, completion_ids[:, 0]]
    if T == 1:
        return first[:, None]
    cache = out.past_key_values
    cache.batch_repeat_interleave(b)
    rest = model(input_ids=completion_ids[:, :-1], past_key_values=cache, use_cache=True)
    tail = torch.log_softmax(rest.logits.float(), dim=-1)
    tail = tail.gather(-1, completion_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([first[:, None], tail], dim=1)


def _trim_completions(
    c_ids: torch.Tensor, c_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop all-pad completion columns on the right."""
    keep = max(int(c_mask.long().sum(dim=1).max()), 1)
    return c_ids[:, :keep], c_mask[:, :keep]


def _trim(
    p_ids: torch.Tensor, p_mask: torch.Tensor, c_ids: torch.Tensor, c_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop all-pad prompt columns on the left and all-pad completion columns on the right."""
    keep_p = int(p_mask.long().sum(dim=1).max())
    c_ids, c_mask = _trim_completions(c_ids, c_mask)
    return p_ids[:, -keep_p:], p_mask[:, -keep_p:], c_ids, c_mask
