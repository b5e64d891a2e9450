"""Proof at load that the gates sit exactly on the residual writes (issue 12, SPEC §1).

Every time a model is gated, after discovery (whose captured forward gave the ungated
logits) two more short forwards on the same ``PROBE_TOKENS`` tokens, in the model's
dtype, with the real whole-write gate hooks installed (``cdscope.core.gates.sites.WriteSite``,
the hooks ``cdscope.core.gating.model.GatedModel`` installs at sublayer granularity), and
one ungated forward on those tokens with their second half changed (check 4):

1. **unit gates**: with g = 1 the logits equal the ungated logits bit for bit;
2. **write sum** (same forward, writes captured after their gate): for every block and
   every element i, ``|h_out - h_in - sum_k s_k w_k|_i <= 8 eps(dtype) * (|h_in| + |h_out|
   + sum_k |s_k w_k|)_i`` (``discovery.write_sum_error``: the rounding of at most 8
   additions and scalings in the model's dtype, with a margin of 2) — nothing but the
   gated writes changes the stream inside a block (a write into several residual streams
   counts as its expanded ``e (x) w``, ``cdscope.core.models.streams``); in a block with a
   *mixed carry* (DeepSeek-V4) the identity is checked per step, from the step's carry
   ``M^T H`` (recomputed from the mixing matrix the block computed in this forward) to the
   streams the next step reads, and the block's input must be what its first mixing
   module reads;
3. **zero gates**: with every g = 0 the last block's output equals the first block's
   input bit for bit — nothing else writes to the stream between or inside blocks. With a
   mixed carry the streams change at g = 0 by design, so instead every block's input
   equals the previous block's output and every step's output equals its carry alone,
   bit for bit ("mixed, never written");
4. **causal**: changing the second half of the probe tokens leaves the first half's
   logits in place (``cdscope.core.models.causal``) — the teacher-forced likelihood is defined.

Where the stream starts after a norm of the embeddings inside block 0 (RWKV's ``pre_ln``,
``Architecture.stream_start``), that norm's output stands for the first block's input in
checks 2 and 3.

Then ``own_head`` (``cdscope.core.models.head``) records whether cdscope's output head on
the backbone's hidden states gives the model's own logits; where it does not (Cohere's
``logit_scale``, ...), the likelihood runs the model's own forward.

A failure raises ``CdscopeError`` naming the layer, the check and the size of the error.
Non-finite ungated logits (finite hidden states, NaN/inf head) are refused before check 1,
which would otherwise report NaN != NaN as a gate hook that is not an identity.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from cdscope.core.gates.sites import WriteSite, write_sites
from cdscope.core.gates.vocabulary import GateState, gate_dtype
from cdscope.core.models import discovery as d
from cdscope.core.models import streams
from cdscope.core.models.causal import causal_error
from cdscope.core.models.head import own_head
from cdscope.errors import CdscopeError
from cdscope.finite import require_finite
from cdscope.hooks import HookSet, first_tensor

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class ProofResult:
    """Outcome of the four checks (all passed, else ``prove`` raised)."""

    tokens: int
    dtype: str
    unit_gates_exact: bool
    write_sum_error: float  # worst relative error over blocks
    write_sum_tolerance: float
    zero_gates_error: float  # max |h_out(last) - h_in(first)| with g = 0
    seconds: float  # discovery + proof
    causal_error: float = 0.0  # max move of the first half's logits, second half changed
    own_head: bool = True  # backbone + cdscope's head = the model's logits (head.own_head)
    #: what zero gates leave: "identity" (the stream as it came in) or "mixed" (each step's
    #: mixed carry, ``cdscope.core.models.streams``)
    carry: str = "identity"

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _gated_forward(
    model: nn.Module,
    arch,
    sites: list[WriteSite],
    ids: torch.Tensor,
    value: float,  # noqa: ANN001
) -> tuple:
    """Logits, block (in, out) pairs and gated write outputs of one forward at g = value."""
    blocks = arch.layers(model)
    ios: list = [None] * len(blocks)
    outs: list = [None] * arch.K
    weights: list = [None] * arch.K  # stream weights of expanded writes
    mixed: dict = {}  # mixing module -> (streams it read, its mixing matrix): mixed carry
    state = GateState(
        gates=torch.full(
            (1, arch.K), value, dtype=gate_dtype(next(model.parameters()).dtype), device=ids.device
        )
    )

    def block_hook(i: int):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            ios[i] = (
                d.input_tensor(args, kwargs).detach().clone(),
                first_tensor(output).detach().clone(),
            )

        return hook

    def write_hook(k: int):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            outs[k] = first_tensor(output).detach().clone()  # blocks may add to it in place

        return hook

    def weights_hook(k: int, index: int):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            weights[k] = output[index].detach().clone()

        return hook

    def mix_hook(path: str, index: int):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
            mixed[path] = (
                d.input_tensor(args, kwargs).detach().clone(),
                output[index].detach().clone(),
            )

        return hook

    def register(hooks: HookSet) -> None:
        for site in sites:  # the gate hooks first ...
            for handle in site.install(state):
                hooks.add(handle)
        for i, block in enumerate(blocks):
            hooks.add(block.register_forward_hook(block_hook(i), with_kwargs=True))
        for site in sites:  # ... so these see the gated output
            hooks.forward(site.module, write_hook(site.k))
        for k, w in enumerate(arch.writes):
            if w.expand:
                hooks.forward(model.get_submodule(w.expand), weights_hook(k, w.expand_index))
        for m in {w.mix for w in arch.writes if w.mix}:
            module = model.get_submodule(m.path)
            hooks.add(module.register_forward_hook(mix_hook(m.path, m.index), with_kwargs=True))

    start: list = []  # h_0 where block 0 normalises the embeddings first (stream_start)

    def start_hook(module: nn.Module, args: tuple, output: object) -> None:
        start.append(first_tensor(output).detach().clone())

    with HookSet("proof") as hooks:
        register(hooks)
        if arch.stream_start:
            hooks.forward(model.get_submodule(arch.stream_start), start_hook)
        logits = d.run_probe(model, ids)
    if start:  # block 0's stream starts at that norm's output
        ios[0] = (start[0], ios[0][1])
    return logits, ios, outs, weights, mixed


def _term(write, out: torch.Tensor, weights, h_in: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """``s_k w_k`` in float64, shaped like the stream (expanded over several streams)."""
    if write.expand:
        return write.scale * streams.expand(weights, out, h_in)
    return write.scale * out.double().reshape(h_in.shape)


#: what the write-sum and zero-gate checks compare in a block with a mixed carry
_CARRIED = " after its mixed carry (one step per mixing module)"
_ZERO_PLAIN = "last block's output differs from the first block's input"
_ZERO_MIXED = "streams differ from their mixed carry (each step's M^T H, each block's input)"


def _ks(arch, layer: int) -> Iterator[int]:  # noqa: ANN001
    return (k for k, w in enumerate(arch.writes) if w.layer == layer)


def _is_mixed(arch) -> bool:  # noqa: ANN001
    return any(w.mix for w in arch.writes)


def _steps(arch, layer: int, h_in, h_out, mixed: dict) -> list[tuple]:  # noqa: ANN001
    """``(stream before, stream after, gates)`` of each step of block ``layer``: the whole
    block when its streams carry as they are; with a mixed carry, the block input up to
    what the first mixing module reads (no write) and then each step from its carry
    ``M^T H`` (``streams.mixed_steps``) with the writes between its mixing modules."""
    ks = list(_ks(arch, layer))
    order = list(dict.fromkeys(arch.writes[k].mix for k in ks))
    if not order or order[0] is None:
        return [(h_in, h_out, ks)]
    steps = streams.mixed_steps(order, mixed, h_out)
    first = [(h_in, steps[0][0], [])]
    return first + [
        (moved, end, [k for k in ks if arch.writes[k].mix == m])
        for m, (_, moved, end) in zip(order, steps, strict=True)
    ]


def _zero_gates_error(arch, ios: list, mixed: dict) -> tuple[int, float]:  # noqa: ANN001
    """``(layer, max |diff|)`` of the zero-gate check: the last block's output against the
    first block's input, or with a mixed carry each block's input against the previous
    block's output and each step's output against its carry alone ("mixed, never written")."""
    if not _is_mixed(arch):
        return len(ios) - 1, (ios[-1][1].double() - ios[0][0].double()).abs().max().item()
    for layer, (h_in, h_out) in enumerate(ios):
        pairs = [(ios[layer - 1][1], h_in)] if layer else []
        pairs += [(start, end) for start, end, _ in _steps(arch, layer, h_in, h_out, mixed)]
        err = max((a.double() - b.double()).abs().max().item() for a, b in pairs)
        if err != 0.0:
            return layer, err
    return len(ios) - 1, 0.0


def prove(model: nn.Module, arch, ids: torch.Tensor, reference: torch.Tensor, start: float):  # noqa: ANN001
    """Run the four checks of the module docstring; ``ProofResult`` or ``CdscopeError``."""
    dtype = next(model.parameters()).dtype
    dtype_name = str(dtype).removeprefix("torch.")
    tol = d.tolerance(dtype)
    name = arch.model_type
    sites = write_sites(model, arch)
    require_finite(  # before check 1, which would report NaN != NaN as a broken hook
        [(f"{name}: the ungated probe forward's logits", reference)],
        hint="non-finite logits although every hidden state is finite (NaN/inf weights in "
        "the final norm or LM head?): the gates cannot be proven",
    )
    logits, ios, outs, weights, mixed = _gated_forward(model, arch, sites, ids, 1.0)
    if not torch.equal(logits, reference):
        err = (logits.double() - reference.double()).abs().max().item()
        raise CdscopeError(
            f"{name}: proof failed: unit gates change the logits (max |diff| {err:.1e} in "
            f"{dtype_name}); "
            "the gate hooks are not an identity at g = 1"
        )
    worst = 0.0
    for layer, (h_in, h_out) in enumerate(ios):
        tol = max(tol, d.tolerance(d.adding_dtype(h_out, dtype)))  # HY-V4: float32 sums
        for before, after, ks in _steps(arch, layer, h_in, h_out, mixed):
            terms = [_term(arch.writes[k], outs[k], weights[k], h_in) for k in ks]
            err = d.write_sum_error(before, after, terms or [torch.zeros_like(before)])
            worst = max(worst, err)
            if not err <= tol:
                hint = "; load the model in float32" if dtype in HALF else ""
                raise CdscopeError(
                    f"{name}: proof failed at layer {layer}: block output - input != sum of "
                    f"its gated writes{_CARRIED if _is_mixed(arch) else ''} in "
                    f"{dtype_name} (rel. error {err:.1e} > {tol:.1e}, 8 epsilons of "
                    f"{dtype_name}){hint}"
                )
    _, ios0, _, _, mixed0 = _gated_forward(model, arch, sites, ids, 0.0)
    zero_layer, zero_err = _zero_gates_error(arch, ios0, mixed0)
    if zero_err != 0.0:
        raise CdscopeError(
            f"{name}: proof failed at layer {zero_layer}: with every gate at 0 the "
            f"{_ZERO_MIXED if _is_mixed(arch) else _ZERO_PLAIN} (max |diff| {zero_err:.1e} "
            f"in {dtype_name}): something else writes to the residual stream"
        )
    causal = causal_error(model, ids, reference, name)
    own = own_head(model, arch.blocks_path, ids, reference)
    return ProofResult(
        tokens=int(ids.shape[1]),
        dtype=dtype_name,
        unit_gates_exact=True,
        write_sum_error=worst,
        write_sum_tolerance=tol,
        zero_gates_error=zero_err,
        seconds=time.perf_counter() - start,
        causal_error=causal,
        own_head=own,
        carry="mixed" if _is_mixed(arch) else "identity",
    )
