"""Why a block is not a sum of residual writes, measured on its captured forward (issue 31).

``discovery.solve_block`` refuses a block when no set of module outputs sums to its
update ``h_out - h_in``. The refusal then names what is not additive, from the same
captured forward (``BlockTrace``), checked in this order:

1. **a recurrent stack** (``recurrent``): the block ran more than once in one forward
   (HRM's low- and high-level stacks run their layers once per cycle with shared
   weights): a gate on a write would scale every cycle's call of it at once, so no gate
   is the write of one step; checked before the search.
2. **a reversible residual** (``reversible``): the block takes two tensors of the
   stream's shape (``X1, X2``) and returns two (``Y1, Y2``), each an input half plus
   one sublayer's output that reads the other half (Reformer's RevNet coupling
   ``Y1 = X1 + attention(X2)``, ``Y2 = X2 + feed_forward(Y1)``, concatenated to ``2d``
   after the last block): the first tensor, the one gates and proof see, is one half, so
   a write into the other half is missed; checked before the search (the half alone fits).
3. **several residual streams** (``several_streams``): the block's stream holds ``n``
   times as many numbers as its sublayers' outputs, and their last dimension is the
   stream's (or a ``1/n`` of it), and no expanded-write form of ``cdscope.core.models.streams``
   fits (neither the streams carried as they are, HY-V4 and Qwen4-exp, nor a mixed carry
   ``M^T H`` with ``M`` an ``[n, n]`` output of a module that reads the streams before
   each sublayer, DeepSeek-V4): the mixing cannot be identified (Gemma-3n's AltUp
   predicts the streams with learned coefficients and corrects them after the sublayers),
   so a sublayer's output reaches the streams only through that mixing.
4. **a norm on the residual path** (``through_norm``): ``h_out`` equals a scaled output
   of a norm inside the block plus at most two module outputs (least squares, within
   ``discovery.tolerance``): the stream itself is normalised inside the block (post-LN:
   BERT's ``output.LayerNorm``, MiniMax's DeepNorm-style ``post_attention_layernorm``),
   so ``h_out - h_in`` is no sum of writes. (A norm of the embeddings that block 0 runs
   first, RWKV's ``pre_ln``, starts the stream instead: ``stream_start``, tried before.)
5. **no h_in term** (``replaces_stream``): ``h_out`` is a sum of at most three module
   outputs without ``h_in``: the input reaches the output only inside a sublayer that
   adds the residual itself (Megatron-BERT's attention) or not at all (Inkling-2's
   block-attention residuals at a block boundary: the earlier blocks' states are kept
   aside and attended over, and the stream starts again from the sublayers' outputs).
6. **a scaled carry** (``scaled_carry``): ``h_out = c h_in + sum_k s_k w_k`` with
   ``c != 1`` for at most three module outputs (least squares, within
   ``discovery.tolerance``): the block shrinks the stream it carries (Beam's
   depth-scaled residual ``h' = a / sqrt(i) + h sqrt((i - 1) / i)`` at each of its
   sublayers), so with every gate at 0 the stream still changes and ``h_out - h_in`` is
   no sum of writes.

Anything else keeps the generic reason. Module names are relative to the block and no
measured number enters the text, so the refusal is the same on every CPU.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations

import torch
from torch import nn

from cdscope.core.models import discovery as d

#: the generic reason when none of the measured ones applies
GENERIC = "not a residual decoder block (post-LN or custom block?)"


def _relative(name: str, prefix: str) -> str:
    return name[len(prefix) :] if name.startswith(prefix) else name


def _leaf_norm(module: nn.Module) -> bool:
    """A norm without submodules (RoBERTa-PreLN's ``...PreLayerNormOutput`` is no norm)."""
    return d.is_norm(module) and not any(True for _ in module.children())


def recurrent(trace: d.BlockTrace) -> str | None:
    """The reason a block that ran more than once in one forward cannot be gated."""
    if trace.calls <= 1:
        return None
    return (
        f"the block runs {trace.calls} times in one forward (its weights are shared across "
        "recurrent cycles): a gate on one of its writes would scale every cycle's call at "
        "once, so no gate is the write of one step"
    )


def reversible(trace: d.BlockTrace, prefix: str, dtype: torch.dtype) -> str | None:
    """The reason when the block updates two half-streams, each by one sublayer's output
    (``Y_j = X_i + o``, ``o`` a direct child's output, ``write_sum_error`` within
    ``discovery.tolerance``; the halves are not named by position: Reformer's first block
    takes the embeddings twice, ``X1 = X2``)."""
    if len(trace.ins) < 2 or len(trace.outs) < 2:
        return None
    children = sorted(
        (r for r in trace.records.values() if r.depth == 1 and r.calls == 1 and r.out is not None),
        key=lambda r: r.order,
    )
    writers: dict[int, d.Record] = {}  # output index -> the sublayer that wrote it
    for j, y in enumerate(trace.outs):
        for r in children:
            adds = (
                not torch.equal(y, x) and d.write_sum_error(x, y, [r.out]) <= d.tolerance(dtype)
                for x in trace.ins
            )
            taken = any(w is r for w in writers.values())
            if not taken and r.out.shape == y.shape and any(adds):
                writers[j] = r
                break
    if len(writers) < 2:
        return None
    names = [_relative(r.name, prefix) for r in sorted(writers.values(), key=lambda r: r.order)]
    chained = [
        f"{_relative(r.name, prefix)} reads the half {_relative(w.name, prefix)} wrote"
        for r in writers.values()
        for j, w in writers.items()
        if w is not r and d._same(r.inp, trace.outs[j])
    ]
    return (
        f"a reversible residual (two half-streams): the block takes {len(trace.ins)} tensors "
        f"of the stream's shape and returns {len(trace.outs)}, each an input half plus one "
        f"sublayer's output ({'; '.join([', '.join(names), *chained])}): the hidden state "
        "gates and proof see is one half, so a write into the other half is not gated"
    )


def several_streams(trace: d.BlockTrace, prefix: str) -> str | None:
    """The reason when the stream is ``n`` copies of what the block's sublayers write."""
    shape = tuple(trace.h_in.shape)
    writers = []
    for rec in sorted(trace.records.values(), key=lambda r: r.order):
        if rec.depth != 1 or rec.calls != 1 or rec.out is None or not rec.out.numel():
            continue
        n, rest = divmod(trace.h_in.numel(), rec.out.numel())
        width = rec.out.shape[-1]
        if rest == 0 and n > 1 and width in (shape[-1], shape[-1] // n):
            writers.append((n, width, _relative(rec.name, prefix)))
    if not writers:
        return None
    n, width, _ = writers[0]
    names = ", ".join(name for m, w, name in writers if (m, w) == (n, width))
    return (
        f"the block carries {n} residual streams (hidden state {list(shape)}) and its "
        f"sublayers ({names}) write one stream's width ({width}): the block mixes the "
        "streams with learned weights in a form cdscope cannot identify (neither H + e (x) a "
        "nor a mixed carry M^T H + e (x) a fits each step; AltUp's predict / correct), so "
        "its update is no sum of their expanded outputs"
    )


def _lead_scales(
    trace: d.BlockTrace, lead: torch.Tensor, others: list, sizes: range, dtype: torch.dtype
) -> Iterator[float]:
    """The scale ``c`` of every fit ``h_out = c lead + sum_k s_k o_k`` (least squares,
    ``write_sum_error`` within ``discovery.tolerance``) over combinations of ``others``'
    outputs of each size in ``sizes``, the fewest first."""
    zero = torch.zeros_like(trace.h_out, dtype=torch.float64)
    target = trace.h_out.double().reshape(-1, 1)
    for size in sizes:
        for combo in combinations(others, size):
            X = torch.stack(
                [t.double().reshape(-1) for t in (lead, *(r.out for r in combo))], dim=1
            )  # noqa: N806
            scales = torch.linalg.lstsq(X, target).solution[:, 0]
            if d.write_sum_error(zero, trace.h_out, X * scales) <= d.tolerance(dtype):
                yield float(scales[0])


def through_norm(
    trace: d.BlockTrace, model: nn.Module, prefix: str, dtype: torch.dtype
) -> str | None:
    """The reason when the block's output is a norm's output plus module outputs."""
    shape = trace.h_in.shape
    pool = [
        r
        for r in sorted(trace.records.values(), key=lambda r: r.order)
        if r.calls == 1 and r.out is not None and r.out.shape == shape
    ]
    norms = [r for r in pool if _leaf_norm(model.get_submodule(r.name))]
    for size in range(3):  # the fewest other outputs first, over every norm
        for norm in norms:
            others = [r for r in pool if r is not norm]
            scales = _lead_scales(trace, norm.out, others, range(size, size + 1), dtype)
            if not any(abs(c) > 1e-6 for c in scales):
                continue
            name = _relative(norm.name, prefix)
            return (
                f"its output is {name}'s output plus module outputs: the stream "
                f"itself passes through the norm {name} inside the block (post-LN, "
                "or a norm of the block input that the writes are added to), so "
                "h_out - h_in is no sum of writes"
            )
    return None


def scaled_carry(trace: d.BlockTrace, dtype: torch.dtype) -> str | None:
    """The reason when the block's output is ``c h_in`` plus module outputs, ``c != 1``."""
    pool = d.candidates(trace, d.MAX_DEPTH)
    tol = d.tolerance(dtype)
    scales = _lead_scales(trace, trace.h_in, pool, range(1, 4), dtype)
    if any(abs(c) > 1e-6 and abs(c - 1) > 64 * tol for c in scales):
        return (
            "its output is a multiple of h_in other than 1 plus module outputs: "
            "the block scales the stream it carries (a depth-scaled residual), "
            "so with every gate at 0 the stream still changes and h_out - h_in "
            "is no sum of writes"
        )
    return None


def replaces_stream(trace: d.BlockTrace, dtype: torch.dtype) -> str | None:
    """The reason when the block's output is a sum of module outputs without its input."""
    pool = d.candidates(trace, d.MAX_DEPTH)
    zero = torch.zeros_like(trace.h_in)
    for size in range(1, 4):
        for combo in combinations(pool, size):
            if d.fit(d.BlockTrace(zero, trace.h_out), list(combo), dtype).error <= d.tolerance(
                dtype
            ):
                return (
                    "its output is a sum of module outputs with no h_in term of its own: "
                    "the block input reaches the output only through a sublayer (one that "
                    "adds the residual inside itself, or none: the block restarts the "
                    "stream), so h_out - h_in is no sum of writes"
                )
    return None


def why_not_additive(trace: d.BlockTrace, model: nn.Module, prefix: str, dtype: torch.dtype) -> str:
    """The measured reason a block that no write set fits is refused (module docstring)."""
    return (
        several_streams(trace, prefix)
        or through_norm(trace, model, prefix, dtype)
        or replaces_stream(trace, dtype)
        or scaled_carry(trace, dtype)
        or GENERIC
    )
