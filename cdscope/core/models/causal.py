"""Check 4 of the load proof: the model is causal (SPEC §2).

``log pi(y* | x; g)`` is teacher-forced: the logits at position t score token t + 1 from
tokens 0..t alone. A model whose earlier logits see later tokens (bidirectional attention,
XLNet's permutation LM, a mask set up for an encoder) would score each answer token with
the answer in view, and every l_m and C built on it would be meaningless, with no error
anywhere. So the proof changes the second half of the T probe tokens and requires the
first half's logits to stay put, h = floor(T / 2):

    max_{t < h} |logits'(t) - logits(t)| <= max(8 eps(dtype), LEAK) * max_{t < h} |logits(t)|

A causal mask contributes exact zeros; what remains is the rounding of kernels that group
the tokens differently (MoE experts), measured over the 141 supported tiny types in four
dtypes at most 3.4 eps * max (float32 Mixtral-family MoE), and it grows with depth. So the
bound is not a few epsilons but ``LEAK``, a thousandth of the logits' scale: 2,400x that
float32 floor, and 9x under the weakest leak of a bidirectional tiny type in float32
(RoCBert 9.2e-3 of the scale; BERT 2.2e-2, XLNet 5.6e-2, CPM-Ant 0.82: its causal-LM
forward sets every position as context, so attention runs both ways). In bfloat16
8 eps (6.3e-2) is the larger term, so a smaller leak is not seen there; float32 and
float64, which every exactness check uses, see it.
"""

from __future__ import annotations

import torch
from torch import nn

from cdscope.core.models import discovery as d
from cdscope.errors import CdscopeError
from cdscope.finite import require_finite

LEAK = 1e-3  # relative move of the first half's logits that counts as seeing later tokens


def changed_tail(ids: torch.Tensor, vocab: int) -> tuple[torch.Tensor, int]:
    """``ids`` with every token from ``h = T // 2`` on replaced by the next id inside
    ``[1, vocab - 1]``, and ``h``."""
    head = ids.shape[1] // 2
    changed = ids.clone()
    changed[:, head:] = ids[:, head:] % max(vocab - 1, 1) + 1
    return changed, head


def causal_error(model: nn.Module, ids: torch.Tensor, reference: torch.Tensor, name: str) -> float:
    """Largest move of the first half's logits when the second half's tokens change.

    ``reference``: the model's logits for ``ids`` (the discovery forward's); ``name``: its
    model type, for the message. Raises
    ``CdscopeError`` when the move exceeds the bound of the module docstring.
    """
    vocab = int(getattr(d.text_config(model), "vocab_size", 0) or 0) or reference.shape[-1]
    changed, head = changed_tail(ids, vocab)
    if head == 0 or torch.equal(changed, ids):  # one token, or nothing to change to
        return 0.0
    earlier = reference[:, :head].double()
    logits = d.run_probe(model, changed)
    tail = changed[0, head:].tolist()
    require_finite(  # NaN would read as a move: name it for what it is
        [(f"{name}: the logits of the causality check (tail tokens {tail})", logits)],
        hint="NaN/inf weights or embedding rows of those tokens?",
    )
    moved = (logits[:, :head].double() - earlier).abs().max().item()
    bound = max(d.tolerance(reference.dtype), LEAK) * earlier.abs().max().item()
    if not moved <= bound:
        raise CdscopeError(
            f"{name}: proof failed: changing the last {ids.shape[1] - head} of {ids.shape[1]} "
            f"tokens moves the logits at earlier positions (max |diff| {moved:.1e} > "
            f"{bound:.1e}): the model is not causal "
            "(bidirectional attention?), so the log-likelihood of an answer given its prompt "
            "(SPEC §2) is not defined; cdscope measures causal decoders"
        )
    return moved
