"""Blocks with several residual streams: expanded writes (issue 31, docs/decisions.md).

Hyper-connection blocks keep ``n`` copies of the residual stream (hidden states
``[..., n, D]``, or flattened ``[..., n * D]``) and give each sublayer one stream's width:
a hyper-connection module reads the streams before the sublayer and returns, besides the
sublayer's input, per-token stream weights ``e [..., n]``; the sublayer's output
``a [..., D]`` enters the streams as the outer product

    H' = H + e (x) a        (HY-V4's ``post``, Qwen4-exp's ``injection_weights``)

so the block update is a sum of *expanded writes* ``e_k (x) a_k``. The gate sits on
``a_k`` (the sublayer's output, the same hook as any write); since ``e_k`` is computed
from the streams before the sublayer, ``e_k (x) (g_k a_k) = g_k (e_k (x) a_k)``: the gate
scales the whole expanded write and C keeps its meaning (SPEC §1). DeepSeek-V4's
manifold-constrained variant also mixes the carried streams (``H' = comb^T H + post (x)
a``), so its update is no sum of writes and it stays refused (docs/decisions.md).

``solve_expanded`` finds the expanded writes of one block from the captured forward
(``discovery.BlockTrace``): the candidates ``a`` are the block's direct children whose
output has one stream's width, each paired with the stream weights ``e`` of the latest
direct child called before it that returned a ``[..., n]`` tensor (any element of a
tuple); the smallest set whose expanded writes sum to ``h_out - h_in`` within
``discovery.tolerance`` is the block's writes (``discovery.fit``).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

import torch

from cdscope.core.models import discovery as d


@dataclass(frozen=True)
class Expansion:
    """Where a write's stream weights come from: element ``index`` of ``path``'s output."""

    path: str
    index: int


def stream_count(h: torch.Tensor, write: torch.Tensor) -> int:
    """``n`` when ``h`` holds ``n > 1`` streams of ``write``'s width (``[..., n, D]`` or
    ``[..., n * D]`` against ``[..., D]``), else 0."""
    lead, width = tuple(write.shape[:-1]), write.shape[-1]
    if h.dim() == write.dim() + 1 and tuple(h.shape[:-2]) == lead and h.shape[-1] == width:
        return int(h.shape[-2]) if h.shape[-2] > 1 else 0
    if h.dim() == write.dim() and tuple(h.shape[:-1]) == lead and h.shape[-1] % width == 0:
        n = h.shape[-1] // width
        return n if n > 1 else 0
    return 0


def expand(weights: torch.Tensor, write: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The expanded write ``weights (x) write`` in float64, shaped like the streams ``like``."""
    outer = weights.double().unsqueeze(-1) * write.double().unsqueeze(-2)
    return outer.reshape(like.shape)


@dataclass(frozen=True)
class ExpandedFit:
    fit: d.Fit
    expansions: tuple[Expansion, ...]  # one per name of ``fit``, in the same order


def _pairs(trace: d.BlockTrace) -> list[tuple[d.Record, Expansion, torch.Tensor]]:
    """Each direct child writing one stream's width, with the latest stream weights."""
    recs = sorted(
        (r for r in trace.records.values() if r.depth == 1 and r.calls == 1),
        key=lambda r: r.order,
    )
    writers = [r for r in recs if r.out is not None and stream_count(trace.h_in, r.out)]
    if not writers:
        return []
    n, lead = stream_count(trace.h_in, writers[0].out), tuple(writers[0].out.shape[:-1])
    pairs, latest = [], None
    for rec in recs:
        if rec in writers and stream_count(trace.h_in, rec.out) == n and latest is not None:
            pairs.append((rec, *latest))
        for i, t in enumerate(rec.outs):
            if t.is_floating_point() and tuple(t.shape) == (*lead, n):
                latest = (Expansion(rec.name, i), t)
    return pairs


def solve_expanded(trace: d.BlockTrace, dtype: torch.dtype) -> ExpandedFit | None:
    """The expanded writes of a multi-stream block (module docstring), or None."""
    pairs = _pairs(trace)
    tol = d.tolerance(dtype)
    terms = [
        d.Record(rec.name, 1, rec.order, 1, rec.inp, expand(e, rec.out, trace.h_in))
        for rec, _, e in pairs
    ]
    for size in range(1, min(d.MAX_WRITES, len(terms)) + 1):
        fits = []
        for combo in combinations(range(len(terms)), size):
            found = d.fit(trace, [terms[i] for i in combo], dtype)
            if found.error <= tol and all(abs(s) > 1e-6 for s in found.scales):
                fits.append((found, combo))
        if fits:
            best, combo = min(fits, key=lambda f: sum(abs(s - 1) for s in f[0].scales))
            return ExpandedFit(best, tuple(pairs[i][1] for i in combo))
    return None
