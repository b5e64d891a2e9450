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
scales the whole expanded write and C keeps its meaning (SPEC §1). F of such a write is
``|e_k| |a_k|`` per position (``cdscope.core.gates.sites.WriteSite``).

**Mixed carry** (DeepSeek-V4's manifold-constrained hyper-connections): each sublayer's
hyper-connection module also returns an ``[..., n, n]`` matrix ``M`` (``comb``) computed
from the streams ``H`` it reads, and the step carries ``M^T H`` instead of ``H``:

    H' = M^T H + e (x) a                                   (one step per sublayer)

The carry depends on ``H`` only, never on ``a``, so the gate still scales just the
expanded write; with every gate at 0 each step leaves ``M^T H`` ("mixed, never written"),
not ``H``. The steps of a block are its mixing modules in call order: step ``j`` reads
the input of mixing module ``j`` and ends at the input of module ``j + 1`` (the last at
the block's output), and its writes are the one-stream-wide children called in between.

``solve_expanded`` finds the expanded writes of one block from the captured forward
(``discovery.BlockTrace``): the candidates ``a`` are the block's direct children whose
output has one stream's width, each paired with the stream weights ``e`` of the latest
direct child called before it that returned a ``[..., n]`` tensor (any element of a
tuple); the smallest set whose expanded writes sum to ``h_out - h_in`` within
``discovery.tolerance`` is the block's writes (``discovery.fit``). Where none does, the
mixed carry is tried: every step's ``H' - carry`` must be such a sum, with ``M^T`` or
``M`` (one orientation per block, the transpose first) — the carry recomputed in the
streams' dtype as the block computes it (``carry``). No step may be left without a write
and the first mixing module must read the block's input; otherwise the block is refused
(``cdscope.core.models.diagnosis``).
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
class Mixing:
    """Where a step's carry comes from: element ``index`` of ``path``'s output is the
    ``[..., n, n]`` matrix ``M``; the step carries ``M^T H`` (``transposed``) or ``M H`` of
    the streams ``H`` that ``path`` reads (module docstring)."""

    path: str
    index: int
    transposed: bool = True


def carry(matrix: torch.Tensor, h: torch.Tensor, transposed: bool) -> torch.Tensor:
    """The carried streams ``M^T H`` (or ``M H``) in ``h``'s dtype, computed as the block
    computes them (``matrix`` cast to the streams' dtype, one batched matmul), so a step
    with no write equals it bit for bit. ``h`` is ``[..., n, D]`` or flattened
    ``[..., n * D]``."""
    m = matrix.to(h.dtype)
    m = m.transpose(-1, -2) if transposed else m
    if h.dim() == m.dim():
        return torch.matmul(m, h)
    n = m.shape[-1]
    return torch.matmul(m, h.reshape(*h.shape[:-1], n, -1)).reshape(h.shape)


@dataclass(frozen=True)
class ExpandedFit:
    fit: d.Fit
    expansions: tuple[Expansion, ...]  # one per name of ``fit``, in the same order
    #: the carry of each write's step (mixed carry), None where the streams carry as they are
    mixings: tuple[Mixing | None, ...] = ()


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


def _smallest(
    trace: d.BlockTrace, pairs: list[tuple[d.Record, Expansion, torch.Tensor]], dtype: torch.dtype
) -> tuple[d.Fit, tuple[Expansion, ...]] | None:
    """The smallest set of ``pairs`` whose expanded writes sum to the trace's update."""
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
            return best, tuple(pairs[i][1] for i in combo)
    return None


def _mixers(trace: d.BlockTrace, pairs: list) -> list[tuple[d.Record, int]]:
    """The direct children returning an ``[..., n, n]`` tensor, in call order, with its index."""
    if not pairs:
        return []
    n, lead = stream_count(trace.h_in, pairs[0][0].out), tuple(pairs[0][0].out.shape[:-1])
    found = []
    for rec in sorted(trace.records.values(), key=lambda r: r.order):
        if rec.depth != 1 or rec.calls != 1 or rec.inp is None:
            continue
        for i, t in enumerate(rec.outs):
            if t.is_floating_point() and tuple(t.shape) == (*lead, n, n):
                found.append((rec, i))
                break
    return found


def mixed_steps(
    mixings: list[Mixing], seen: dict[str, tuple[torch.Tensor, torch.Tensor]], h_out: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(H read, carry, H left)`` of each step of a block: ``mixings`` are its steps in
    call order, ``seen[path] = (H, M)`` what each mixing module read and returned in one
    forward; step ``j`` ends where step ``j + 1`` reads, the last at the block output."""
    starts = [seen[m.path][0] for m in mixings]
    return [
        (h, carry(seen[m.path][1], h, m.transposed), end)
        for m, h, end in zip(mixings, starts, [*starts[1:], h_out], strict=True)
    ]


def _solve_mixed(trace: d.BlockTrace, dtype: torch.dtype) -> ExpandedFit | None:
    """The mixed-carry steps of a block and their expanded writes (module docstring)."""
    pairs = _pairs(trace)
    mixers = _mixers(trace, pairs)
    if not mixers or not d._same(mixers[0][0].inp, trace.h_in):
        return None
    if any(rec.inp.shape != trace.h_in.shape for rec, _ in mixers):
        return None
    seen = {rec.name: (rec.inp, rec.outs[index]) for rec, index in mixers}
    bounds = [rec.order for rec, _ in mixers] + [max(r.order for r in trace.records.values()) + 1]
    for transposed in (True, False):
        steps = [Mixing(rec.name, index, transposed) for rec, index in mixers]
        names, scales, expansions, mixings, error = [], [], [], [], 0.0
        for j, (_, moved, end) in enumerate(mixed_steps(steps, seen, trace.h_out)):
            inside = [p for p in pairs if bounds[j] < p[0].order < bounds[j + 1]]
            found = _smallest(d.BlockTrace(moved, end), inside, dtype)
            if found is None:
                break
            names += found[0].names
            scales += found[0].scales
            expansions += found[1]
            mixings += [steps[j]] * len(found[1])
            error = max(error, found[0].error)
        else:
            fit = d.Fit(tuple(names), tuple(scales), error)
            return ExpandedFit(fit, tuple(expansions), tuple(mixings))
    return None


def solve_expanded(trace: d.BlockTrace, dtype: torch.dtype) -> ExpandedFit | None:
    """The expanded writes of a multi-stream block (module docstring), or None: the
    streams carried as they are first, then the mixed carry."""
    found = _smallest(trace, _pairs(trace), dtype)
    if found is not None:
        return ExpandedFit(found[0], found[1], (None,) * len(found[1]))
    return _solve_mixed(trace, dtype)
