"""Batched sampling of completions with ``transformers`` ``model.generate``.

``sample`` answers each prompt ``num_samples`` times. Rows are laid out sample-major
within a prompt (prompt 0's samples first, then prompt 1's, ...), cut into chunks of
``batch_size`` rows, and each chunk is one ``model.generate`` call: KV cache, left
padding (so every row's next token sits in the last column), ``do_sample`` with the
given temperature and top-p when ``temperature > 0``, greedy decoding at ``temperature
== 0``. A row stops at its first end-of-sequence token (any id among the tokenizer's EOS
and the model's ``generation_config.eos_token_id``); the EOS is kept and counted.

Sampling follows the model's distribution exactly: ``top_k`` is switched off (the
library default of 50 would otherwise truncate it) and no repetition penalty is
applied, so the rollouts of GRPO (SPEC §5) and the samples behind pass@k (SPEC §7)
come from ``softmax(logits / temperature)`` restricted only by ``top_p``.

Determinism: chunk ``b`` is drawn under ``torch.manual_seed(mix(seed, b))`` inside a
forked RNG state, so the same seed, prompts and ``batch_size`` give the same samples on
the same machine, and the caller's global RNG is left untouched. Changing
``batch_size`` changes which random numbers each row sees (not the distribution).

The prompt text is tokenised raw (no chat template), exactly like the probe pools.

A model whose forward ignores the attention mask (RWKV: its recurrent state reads every
left pad; measured once per call by ``pads_change_logits``) gets chunks of prompts of one
token length only, in row order, so no row is padded on the left.

**Shared prefill** (``share_prefill``, the default): the ``num_samples`` rows of a prompt
read the same prompt, so its KV cache is computed once -- one forward of the distinct
prompts' first ``P - 1`` tokens -- and repeated over the rows
(``Cache.batch_repeat_interleave``); ``generate`` then continues every row from its last
prompt token (Hugging Face's prefix-cache reuse). A chunk then holds whole groups
(``batch_size // num_samples`` prompts, at least one). It is used where it is exact:
``prompt_cache_is_exact`` measures, once per call, that a cache made once and repeated
continues a short sequence with the logits of the whole forward, on a model whose cache is
a ``DynamicCache`` of plain (full or sliding-window) attention layers and which runs no
dropout; other models (recurrent states, static caches, mask-ignoring models) prefill every
row. The samples follow the same distribution; their last-bit rounding differs from
per-row prefill, so a sampled token can differ where two tokens' probabilities tie to
rounding (measured in tests: identical greedy completions).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from cdscope.core.models.architecture import check_fits
from cdscope.core.models.placement import execution_device
from cdscope.errors import CdscopeError
from cdscope.finite import require_finite


@dataclass
class Rollouts:
    """Sampled completions, one row per (prompt, sample)."""

    prompt_index: torch.Tensor  # [N] long: which input prompt each row answers
    prompt_ids: torch.Tensor  # [N, P] long, left-padded with the pad id
    prompt_mask: torch.Tensor  # [N, P] bool, True on real prompt tokens
    completion_ids: torch.Tensor  # [N, T] long, right-padded after the first EOS
    completion_mask: torch.Tensor  # [N, T] bool, True up to and including the first EOS
    truncated: torch.Tensor  # [N] bool: no EOS within the --max-new-tokens cap
    texts: list[str]  # decoded completions (special tokens skipped, stopped at EOS)
    generated_tokens: int  # completion_mask.sum()
    seconds: float


def ensure_pad_token(tokenizer: object) -> int:
    """The tokenizer's pad id; when it has none, the EOS token becomes the pad token."""
    if tokenizer.pad_token_id is None:  # type: ignore[attr-defined]
        if tokenizer.eos_token is None:  # type: ignore[attr-defined]
            raise CdscopeError(
                "the tokenizer has neither a pad nor an EOS token; set tokenizer.pad_token "
                "before sampling"
            )
        tokenizer.pad_token = tokenizer.eos_token  # type: ignore[attr-defined]
    return int(tokenizer.pad_token_id)  # type: ignore[attr-defined]


def eos_token_ids(model: nn.Module, tokenizer: object) -> list[int]:
    """Every id that ends a completion: the tokenizer's EOS plus the model's generation EOS."""
    ids: list[int] = []
    candidates = [getattr(tokenizer, "eos_token_id", None)]
    config = getattr(model, "generation_config", None)
    configured = getattr(config, "eos_token_id", None)
    candidates += configured if isinstance(configured, list | tuple) else [configured]
    for candidate in candidates:
        if candidate is not None and int(candidate) not in ids:
            ids.append(int(candidate))
    if not ids:
        raise CdscopeError(
            "neither the tokenizer nor the model's generation_config names an EOS token; "
            "set tokenizer.eos_token so completions can stop"
        )
    return ids


def chunk_seed(seed: int, chunk: int) -> int:
    """A 63-bit seed for chunk ``chunk`` of a call seeded with ``seed`` (numpy SeedSequence)."""
    state = np.random.SeedSequence([seed, chunk]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def completion_mask(completion_ids: torch.Tensor, eos_ids: Sequence[int]) -> torch.Tensor:
    """True on every generated token up to and including the first EOS of its row."""
    is_eos = torch.isin(completion_ids, torch.tensor(list(eos_ids), device=completion_ids.device))
    # eos strictly before position t <=> cumulative count up to t-1 > 0
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return before == 0


def finite_logits() -> object:
    """A ``logits_processor`` list for ``generate`` that refuses NaN / +inf next-token
    logits (non-finite weights) with one line, instead of sampling from NaN (a torch
    error) or decoding greedy garbage. -inf stays legal (masked tokens)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class FiniteLogits(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if bool((torch.isnan(scores) | torch.isposinf(scores)).any()):
                masked = scores.masked_fill(torch.isneginf(scores), 0.0)
                where = f"after {input_ids.shape[1]} tokens"
                require_finite([("next-token logits [row, token]", masked)], where)
            return scores

    return LogitsProcessorList([FiniteLogits()])


def _validate(
    prompts: Sequence[str],
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    batch_size: int | None,
    top_p: float,
) -> None:
    if len(prompts) == 0:
        raise CdscopeError("no prompts to sample from; give at least one prompt")
    if num_samples < 1:
        raise CdscopeError(f"num_samples must be >= 1, got {num_samples}")
    if max_new_tokens < 1:
        raise CdscopeError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not temperature >= 0:
        raise CdscopeError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise CdscopeError(f"top_p must lie in (0, 1], got {top_p}")
    if seed < 0:
        raise CdscopeError(f"seed must be a non-negative integer, got {seed}")
    if batch_size is not None and batch_size < 1:
        raise CdscopeError(f"batch_size must be >= 1 (or None for one batch), got {batch_size}")


def _pad_stack(rows: list[torch.Tensor], width: int, value: int | bool, left: bool) -> torch.Tensor:
    """Concatenate [b, w_i] chunks into [sum b, width], padding each on the left or right."""
    out = []
    for row in rows:
        pad = width - row.shape[1]
        fill = torch.full((row.shape[0], pad), value, dtype=row.dtype, device=row.device)
        out.append(torch.cat([fill, row] if left else [row, fill], dim=1))
    return torch.cat(out, dim=0)


def pads_change_logits(model: nn.Module, pad_id: int, device: torch.device) -> bool:
    """Whether left padding changes a row's logits although the attention mask hides the
    pads: a recurrent model whose forward ignores the mask (RWKV: its state reads every
    pad). Measured on one three-token row, alone and behind two masked pads (a model that
    honours the mask agrees to its rounding; RWKV's logits move by ~3 on a tiny model)."""
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    ids = torch.tensor([[3, 4, 5]]).clamp(max=max(vocab - 1, 0)).to(device)
    padded = torch.cat([torch.full((1, 2), pad_id, device=device), ids], dim=1)
    mask = torch.ones_like(padded)
    mask[:, :2] = 0
    with torch.no_grad():
        alone = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1].float()
        behind = model(input_ids=padded, attention_mask=mask).logits[0, -1].float()
    return not bool((alone - behind).abs().max() <= 1e-2 * (alone.abs().max() + 1e-6))


def _dropout_active(model: nn.Module) -> bool:
    """Whether a forward of ``model`` draws dropout masks (training mode and a positive
    dropout probability in a module or in the config), which rows cannot share."""
    if not model.training:
        return False
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = vars(getattr(model, "config", object()))
    return any("dropout" in k and isinstance(v, float) and v > 0 for k, v in config.items())


def shareable_cache(cache: object) -> bool:
    """A ``DynamicCache`` whose layers are plain or sliding-window attention layers: the
    prompt's whole effect on later positions, repeatable over rows and differentiable
    (no in-place state updates)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(cache, "layers", None)
    return (
        isinstance(cache, DynamicCache)
        and bool(layers)
        and all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)
    )


def prompt_cache_is_exact(model: nn.Module, device: torch.device) -> bool:
    """Whether a prompt's KV cache, computed once and repeated over rows, continues like
    the whole sequence: measured on one 6-token row (cache of its first 4 tokens, repeated
    twice, then the last 2) against the whole forward of both rows, to max(1e-4, 4 eps of
    the model's dtype) of the logits' scale: float32 rounds one layout against another to
    ~1e-6 there, bfloat16 to its eps (7.8e-3), while a cache that is not the prompt's
    whole state (a position restarting at 0, a missing context) moves the logits by a
    sizeable part of their scale. False for caches that are not ``shareable_cache`` and
    for a model that runs dropout."""
    if _dropout_active(model):
        return False
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]]).clamp(max=max(vocab - 1, 0)).to(device)
    try:
        with torch.no_grad():
            whole = model(input_ids=ids.repeat(2, 1), use_cache=False).logits[:, 4:].float()
            cache = getattr(model(input_ids=ids[:, :4], use_cache=True), "past_key_values", None)
            if not shareable_cache(cache):
                return False
            cache.batch_repeat_interleave(2)
            rest = model(input_ids=ids[:, 4:].repeat(2, 1), past_key_values=cache, use_cache=True)
    except (TypeError, ValueError, RuntimeError, NotImplementedError, AttributeError):
        return False  # a forward that takes no cache this way: every row prefills
    continued = rest.logits.float()
    if continued.shape != whole.shape:
        return False
    scale = float(whole.abs().max()) + 1e-6
    dtype = next(model.parameters()).dtype
    tolerance = max(1e-4, 4 * torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-4
    return bool((continued - whole).abs().max() <= tolerance * scale)


def _prefill(
    model: nn.Module, input_ids: torch.Tensor, attention: torch.Tensor, repeats: int
) -> object | None:
    """The KV cache of every prompt's first P - 1 tokens (left-padded; positions counted
    over real tokens, as ``generate`` counts them), repeated ``repeats`` times per prompt;
    None (``generate`` prefills each row) for ``repeats`` 1 or a prompt of one token."""
    if repeats == 1 or int(attention.sum(dim=1).min()) < 2:
        return None
    head, mask = input_ids[:, :-1], attention[:, :-1]
    positions = (mask.long().cumsum(dim=1) - 1).clamp_min(0)
    cache = model(
        input_ids=head, attention_mask=mask, position_ids=positions, use_cache=True
    ).past_key_values
    cache.batch_repeat_interleave(repeats)
    return cache


def _spans(
    rows: Sequence[str], step: int, tokenizer: object, equal_lengths: bool
) -> list[tuple[int, int]]:
    """``(lo, hi)`` row ranges of the generate calls: ``step`` rows each, and where pads
    would change a row's logits (``pads_change_logits``) only rows whose prompts have one
    token length (runs in row order: no row is moved)."""
    if not equal_lengths:
        return [(lo, min(lo + step, len(rows))) for lo in range(0, len(rows), step)]
    lengths = [len(tokenizer(r, add_special_tokens=True)["input_ids"]) for r in rows]  # type: ignore[operator]
    spans, lo = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or i - lo == step or lengths[i] != lengths[lo]:
            spans.append((lo, i))
            lo = i
    return spans


def sample(
    model: nn.Module,
    tokenizer: object,
    prompts: Sequence[str],
    *,
    num_samples: int,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    batch_size: int | None = None,
    top_p: float = 1.0,
    on_batch: Callable[[int], None] | None = None,
    share_prefill: bool = True,
) -> Rollouts:
    """Sample ``num_samples`` completions for every prompt (see the module docstring).

    ``batch_size`` is the number of rows per ``generate`` call (None: all rows at once).
    ``share_prefill``: compute each prompt's cache once for its rows where that is exact
    (False: every row prefills its own copy, the plain twin).
    ``on_batch(rows_done)`` is called after each chunk (for progress bars). The model is
    put in eval mode for the call and restored afterwards. Returns tensors on the CPU.
    """
    _validate(prompts, num_samples, max_new_tokens, temperature, seed, batch_size, top_p)
    pad_id = ensure_pad_token(tokenizer)
    eos_ids = eos_token_ids(model, tokenizer)
    device = execution_device(model)
    rows = [p for p in prompts for _ in range(num_samples)]
    index = torch.arange(len(prompts)).repeat_interleave(num_samples)
    step = batch_size or len(rows)
    options: dict = dict(
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=eos_ids,
        use_cache=True,
        num_beams=1,
        repetition_penalty=1.0,
        logits_processor=finite_logits(),
    )
    if temperature > 0:
        options.update(do_sample=True, temperature=float(temperature), top_p=float(top_p), top_k=0)
    else:
        options.update(do_sample=False, temperature=None, top_p=None)

    was_training = model.training
    model.eval()
    start = time.perf_counter()
    ids_chunks, pmask_chunks, comp_chunks = [], [], []
    fork = [device] if device.type == "cuda" else []
    try:
        equal_lengths = pads_change_logits(model, pad_id, device)
        groups = num_samples if share_prefill and num_samples > 1 and not equal_lengths else 1
        if groups > 1 and not prompt_cache_is_exact(model, device):
            groups = 1
        if groups > 1:  # whole groups per call: rows lo..hi are prompts lo/G..hi/G
            per_call = max(1, step // groups) * groups
            spans = [(lo, min(lo + per_call, len(rows))) for lo in range(0, len(rows), per_call)]
        else:
            spans = _spans(rows, step, tokenizer, equal_lengths)
        for chunk, (lo, hi) in enumerate(spans):
            enc = tokenizer(  # type: ignore[operator]
                rows[lo:hi:groups],
                return_tensors="pt",
                padding=True,
                padding_side="left",
                add_special_tokens=True,
            )
            input_ids = enc["input_ids"].to(device)
            attention = enc["attention_mask"].to(device)
            check_fits(
                model, input_ids.shape[1] + max_new_tokens, "prompt + --max-new-tokens",
                "lower --max-new-tokens or shorten the prompts",
            )  # fmt: skip
            with torch.random.fork_rng(devices=fork), torch.no_grad():
                torch.manual_seed(chunk_seed(seed, chunk))
                cache = _prefill(model, input_ids, attention, groups)
                input_ids = input_ids.repeat_interleave(groups, dim=0)
                attention = attention.repeat_interleave(groups, dim=0)
                out = model.generate(  # type: ignore[operator]
                    input_ids=input_ids, attention_mask=attention, past_key_values=cache, **options
                )
            ids_chunks.append(input_ids.cpu())
            pmask_chunks.append(attention.bool().cpu())
            comp_chunks.append(out[:, input_ids.shape[1] :].cpu())
            if on_batch is not None:
                on_batch(hi)
    finally:
        model.train(was_training)

    width_p = max(c.shape[1] for c in ids_chunks)
    width_t = max(max(c.shape[1] for c in comp_chunks), 1)
    prompt_ids = _pad_stack(ids_chunks, width_p, pad_id, left=True)
    prompt_mask = _pad_stack(pmask_chunks, width_p, False, left=True)
    completion = _pad_stack(comp_chunks, width_t, pad_id, left=False)
    mask = completion_mask(completion, eos_ids)
    # no EOS at all: the cap cut it (a shorter chunk's right-padding only follows an EOS)
    truncated = ~torch.isin(completion, torch.tensor(list(eos_ids))).any(dim=1)
    completion = completion.masked_fill(~mask, pad_id)
    texts = [
        tokenizer.decode(row[m].tolist(), skip_special_tokens=True)  # type: ignore[attr-defined]
        for row, m in zip(completion, mask, strict=True)
    ]
    return Rollouts(
        prompt_index=index,
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion,
        completion_mask=mask,
        truncated=truncated,
        texts=texts,
        generated_tokens=int(mask.sum()),
        seconds=time.perf_counter() - start,
    )
