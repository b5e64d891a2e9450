"""Where the residual stream starts when block 0 normalises the embeddings (SPEC §1, issue 31).

SPEC §1's ``h_0`` is the embedding output. In most decoders that is the first block's
input. RWKV's block 0 first applies a LayerNorm to its input (``pre_ln``, present in block
0 only) and adds its writes to that normed value:

    h_1 = pre_ln(e) + attn_0(ln1(.)) + ffn_0(ln2(.))

so ``h_out - h_in`` of block 0 is no sum of writes. The norm belongs to the embedding
(it runs once, on the embeddings, before any write), so the stream starts at its output:
``h_0 = pre_ln(e)``, and block 0 is then an ordinary residual block.

Found from the captured forward, not by ``model_type``: when block 0 admits no write set,
its first module to return (a leaf norm whose input is the block input, output shaped
like the stream) is taken as the stream's start, and the block is searched again from
that norm's output. The proof (``cdscope.core.models.proof``) then checks block 0's write
sum from that output and, with every gate at 0, that the last block returns it bit for
bit; edge attribution takes it as the ``emb`` node's activation (``cdscope.core.eap``).
"""

from __future__ import annotations

import torch
from torch import nn

from cdscope.core.models import discovery as d


def embedding_norm(trace: d.BlockTrace, model: nn.Module) -> d.Record | None:
    """Block 0's first module to return, when it is a leaf norm of the block input."""
    direct = [r for r in trace.records.values() if r.depth == 1 and r.out is not None]
    if trace.h_in is None or not direct:
        return None
    first = min(direct, key=lambda r: r.order)
    module = model.get_submodule(first.name)
    if (
        first.calls == 1
        and d.is_norm(module)
        and not any(True for _ in module.children())
        and d._same(first.inp, trace.h_in)
        and first.out.shape == trace.h_in.shape
    ):
        return first
    return None


def solve_after_norm(
    trace: d.BlockTrace, model: nn.Module, dtype: torch.dtype
) -> tuple[d.BlockTrace, d.Fit, str] | None:
    """``(trace from the norm's output, its write set, the norm's path)`` when block 0 is
    a sum of writes once the stream starts after its embedding norm, else None."""
    norm = embedding_norm(trace, model)
    if norm is None:
        return None
    records = {name: r for name, r in trace.records.items() if name != norm.name}
    restarted = d.BlockTrace(norm.out, trace.h_out, records, trace.calls)
    try:
        found = d.solve_block(restarted, dtype, None)
    except d.NotAdditive:
        return None
    return restarted, found, norm.name
