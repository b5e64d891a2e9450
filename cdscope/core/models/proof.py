"""Proof at load that the gates sit exactly on the residual writes (issue 12, SPEC §1).

Every time a model is gated, after discovery (whose captured forward gave the ungated
logits) two more short forwards on the same ``PROBE_TOKENS`` tokens, in the model's
dtype, with the real whole-write gate hooks installed (``cdscope.core.gates.sites.WriteSite``,
the hooks ``cdscope.core.gating.model.GatedModel`` installs at sublayer granularity):

1. **unit gates**: with g = 1 the logits equal the ungated logits bit for bit;
2. **write sum** (same forward, writes captured after their gate): for every block and
   every element i, ``|h_out - h_in - sum_k s_k w_k|_i <= 8 eps(dtype) * (|h_in| + |h_out|
   + sum_k |s_k w_k|)_i`` (``discovery.write_sum_error``: the rounding of at most 8
   additions and scalings in the model's dtype, with a margin of 2) — nothing but the
   gated writes changes the stream inside a block (a write into several residual streams
   counts as its expanded ``e (x) w``, ``cdscope.core.models.streams``);
3. **zero gates**: with every g = 0 the last block's output equals the first block's
   input bit for bit — nothing else writes to the stream between or inside blocks.

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
from dataclasses import dataclass

import torch
from torch import nn

from cdscope.core.gates.sites import WriteSite, write_sites
from cdscope.core.gates.vocabulary import GateState, gate_dtype
from cdscope.core.models import discovery as d
from cdscope.core.models import streams
from cdscope.core.models.head import own_head
from cdscope.errors import CdscopeError
from cdscope.finite import require_finite
from cdscope.hooks import HookSet, first_tensor

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class ProofResult:
    """Outcome of the three checks (all passed, else ``prove`` raised)."""

    tokens: int
    dtype: str
    unit_gates_exact: bool
    write_sum_error: float  # worst relative error over blocks
    write_sum_tolerance: float
    zero_gates_error: float  # max |h_out(last) - h_in(first)| with g = 0
    seconds: float  # discovery + proof
    own_head: bool = True  # backbone + cdscope's head = the model's logits (head.own_head)

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
    return logits, ios, outs, weights


def _term(write, out: torch.Tensor, weights, h_in: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
    """``s_k w_k`` in float64, shaped like the stream (expanded over several streams)."""
    if write.expand:
        return write.scale * streams.expand(weights, out, h_in)
    return write.scale * out.double().reshape(h_in.shape)


def prove(model: nn.Module, arch, ids: torch.Tensor, reference: torch.Tensor, start: float):  # noqa: ANN001
    """Run the three checks of the module docstring; ``ProofResult`` or ``CdscopeError``."""
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
    logits, ios, outs, weights = _gated_forward(model, arch, sites, ids, 1.0)
    if not torch.equal(logits, reference):
        err = (logits.double() - reference.double()).abs().max().item()
        raise CdscopeError(
            f"{name}: proof failed: unit gates change the logits (max |diff| {err:.1e} in "
            f"{dtype_name}); "
            "the gate hooks are not an identity at g = 1"
        )
    worst = 0.0
    for layer, (h_in, h_out) in enumerate(ios):
        ks = [k for k, w in enumerate(arch.writes) if w.layer == layer]
        terms = [_term(arch.writes[k], outs[k], weights[k], h_in) for k in ks]
        err = d.write_sum_error(h_in, h_out, terms)
        tol = max(tol, d.tolerance(d.adding_dtype(h_out, dtype)))  # HY-V4: float32 sums
        worst = max(worst, err)
        if not err <= tol:
            hint = "; load the model in float32" if dtype in HALF else ""
            raise CdscopeError(
                f"{name}: proof failed at layer {layer}: block output - input != sum of its "
                f"gated writes in {dtype_name} (rel. error {err:.1e} > {tol:.1e}, 8 epsilons "
                f"of {dtype_name}){hint}"
            )
    _, ios0, _, _ = _gated_forward(model, arch, sites, ids, 0.0)
    zero_err = (ios0[-1][1].double() - ios0[0][0].double()).abs().max().item()
    if zero_err != 0.0:
        raise CdscopeError(
            f"{name}: proof failed at layer {len(ios0) - 1}: with every gate at 0 the last "
            f"block's output differs from the first block's input (max |diff| {zero_err:.1e} "
            f"in {dtype_name}): something else writes to the residual stream"
        )
    own = own_head(model, arch.blocks_path, ids, reference)
    return ProofResult(
        tokens=int(ids.shape[1]),
        dtype=dtype_name,
        unit_gates_exact=True,
        write_sum_error=worst,
        write_sum_tolerance=tol,
        zero_gates_error=zero_err,
        seconds=time.perf_counter() - start,
        own_head=own,
    )
