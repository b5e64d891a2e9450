"""Gates finer than a whole write: attention heads, MoE experts, MLP neurons (SPEC §1).

A residual write that is linear in its units is split into one gate per unit:

* attention (``head``, and ``neuron``): the write is ``o_proj(concat_h a_h) = sum_h
  a_h W_h^T + b`` (W_h the head's column slice of the output projection; the bias
  belongs to no head). Gate ``h`` multiplies the head's slice of the projection's input:
  a forward PRE-hook on the projection, so ``g = 1`` multiplies by 1.0 (bit-exact).
* dense MLP (``neuron``): ``down_proj(a) = sum_j a_j W[:, j] + b``; gate ``j`` multiplies
  neuron ``j``'s column of the down-projection input, the same pre-hook with width 1.
* MoE (``expert``, and ``neuron``: expert neurons are not split): the write is
  ``sum_e w_e(x) f_e(x)`` over the routed experts plus the shared experts' outputs.
  Gate ``e`` multiplies the routing weight ``w_e`` handed to the fused experts module
  (``forward(hidden_states, top_k_index, top_k_weights)``, transformers' 3D-parameter
  experts, every experts implementation), so it scales exactly the expert's weighted
  contribution and leaves the routing alone; shared experts (a child ``shared_expert`` /
  ``shared_experts``) are units ``E, E+1, ...`` gated on their output.

Because each write is the sum of its units' contributions (plus a unit-free bias), the
chain rule gives ``sum_u dl/dg_u = dl/dg_write`` for a bias-free projection: summed unit
columns of C reproduce the sublayer C (tests/core/test_granularity.py).

F of a unit is the norm of its contribution, computed only when norms are captured and
without forming the contributions: ``||a_h W_h^T||^2 = a_h (W_h^T W_h) a_h^T`` with the
``[U, w, w]`` per-unit Gram of the projection's columns (``w`` = head_dim, or 1 for
neurons, where it is ``a_j^2 ||W[:, j]||^2``); for experts, one extra no-grad call of the
experts module per routing slot.

The projection of a write is found by data flow, not by name: among the Linear / Conv1D
modules inside the sublayer, the last one whose output equals the write in one captured
forward (post-norm writes, whose output is not linear in the units, are refused).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from cdscope.core.gates.sites import (
    EXPERT_ARGS,
    ExpertSite,
    SliceSite,
    WriteSite,
    fused_experts,
    out_in_weight,
    write_sites,
)
from cdscope.core.gates.vocabulary import GateSite
from cdscope.core.models import discovery as d
from cdscope.core.models.architecture import Architecture, Write
from cdscope.core.models.placement import execution_device
from cdscope.errors import CdscopeError
from cdscope.settings.names import SUBLAYER

#: granularity -> {write role: the unit its writes are split into}; roles not named keep one
#: gate
UNIT_KINDS: dict[str, dict[str, str]] = {
    "head": {"attn": "head"},
    "expert": {"moe": "expert"},
    "neuron": {"attn": "head", "mlp": "neuron", "moe": "expert"},
}
_WHAT = {"head": "attention heads", "expert": "MoE experts", "neuron": "MLP neurons"}
_UNITS = {"head": "heads", "expert": "experts", "neuron": "neurons"}


# ------------------------------------------------------------------------ discovery


def _is_projection(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"


def find_projections(model: nn.Module, writes: list[Write]) -> dict[str, nn.Module]:
    """``{write path: projection}``: per write, the last Linear / Conv1D inside its sublayer
    whose output equals the write in one captured no-grad forward (module doc)."""
    outputs: dict[str, list] = {}
    handles = []

    def record(name: str):  # noqa: ANN202
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            out = output[0] if isinstance(output, tuple) else output
            outputs.setdefault(name, []).append(out.detach())

        return hook

    candidates: dict[str, list[str]] = {}
    for w in writes:
        sub = model.get_submodule(w.sublayer)
        names = [  # the sublayer itself may be the projection (OPT's fc2)
            f"{w.sublayer}.{n}".rstrip(".") for n, m in sub.named_modules() if _is_projection(m)
        ]
        candidates[w.path] = names
        for name in dict.fromkeys([*names, w.path]):  # OPT: the write is the projection
            handles.append(model.get_submodule(name).register_forward_hook(record(name)))
    try:
        with d.eval_mode(model), torch.no_grad():
            model(d.probe_ids(model, execution_device(model)), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    found = {}
    for w in writes:
        write = outputs[w.path][-1]
        equal = [
            n
            for n in candidates[w.path]
            if len(outputs.get(n, ())) == 1
            and outputs[n][0].numel() == write.numel()
            and torch.equal(outputs[n][0].reshape(write.shape).to(write.device), write)
        ]
        if not equal:
            raise CdscopeError(
                f"layer {w.layer} {w.role}: no Linear inside {w.sublayer} outputs the write, so "
                "it cannot be split into units; use --granularity sublayer"
            )
        found[w.path] = model.get_submodule(equal[-1])
    return found


def _head_count(model: nn.Module, proj: nn.Module, w: Write) -> int:
    heads = int(getattr(d.text_config(model), "num_attention_heads", 0) or 0)
    width = out_in_weight(proj).shape[1]
    if heads < 1 or width % heads:
        raise CdscopeError(
            f"layer {w.layer}: the attention output projection reads {width} features, not a "
            f"whole number of {heads} heads; use --granularity sublayer"
        )
    return heads


def _expert_site(model: nn.Module, k: int, w: Write) -> ExpertSite:
    sub = model.get_submodule(w.sublayer)
    fused = [m for n, m in sub.named_modules() if n and fused_experts(m)]
    if len(fused) != 1:
        raise CdscopeError(
            f"layer {w.layer}: the MoE block {type(sub).__name__} has no fused experts module "
            f"taking ({', '.join(EXPERT_ARGS)}); --granularity expert needs one"
        )
    experts = fused[0]
    count = int(getattr(experts, "num_experts", 0) or experts.down_proj.shape[0])
    children = dict(sub.named_children())
    shared = []
    for name in ("shared_expert", "shared_experts"):
        if name in children:
            site = WriteSite(
                k + count + len(shared), w.layer, w.role, children[name], count + len(shared)
            )
            scale = children.get(f"{name}_gate")
            shared.append((site, scale if _is_projection(scale) else None))
    return ExpertSite(k, w.layer, w.role, experts, count, shared)


def unit_sites(model: nn.Module, arch: Architecture, granularity: str) -> list[GateSite]:
    """The gate sites of ``model`` at ``granularity`` (a key of UNIT_KINDS), in gate order."""
    split = UNIT_KINDS[granularity]
    kinds = {w.path: split.get(w.role) for w in arch.writes}
    if not any(kinds.values()):
        raise CdscopeError(
            f"{arch.model_type} has no {_WHAT[granularity]} (its writes are "
            f"{', '.join(sorted({w.role for w in arch.writes}))}): use another --granularity"
        )
    if any(w.expand for w in arch.writes):
        raise CdscopeError(
            f"{arch.model_type}'s writes enter several residual streams (hyper-connections): "
            "a unit's F would miss the stream weights; use --granularity sublayer"
        )
    for w in arch.writes:
        if kinds[w.path] and w.post_norm:
            raise CdscopeError(
                f"{arch.model_type}: layer {w.layer}'s {w.role} write is normalised after the "
                f"sublayer, so it is not a sum of {_UNITS[kinds[w.path]]}; use --granularity sublayer"
            )
    sliced = [w for w in arch.writes if kinds[w.path] in ("head", "neuron")]
    projections = find_projections(model, sliced) if sliced else {}
    sites: list[GateSite] = []
    k = 0
    for w in arch.writes:
        kind = kinds[w.path]
        if kind is None:
            site = WriteSite(k, w.layer, w.role, model.get_submodule(w.path))
        elif kind == "expert":
            site = _expert_site(model, k, w)
        else:
            proj = projections[w.path]
            width = out_in_weight(proj).shape[1]
            count = _head_count(model, proj, w) if kind == "head" else width
            site = SliceSite(k, w.layer, w.role, proj, count, width // count)
        sites.append(site)
        k += len(site.units)
    return sites


SiteBuilder = Callable[[nn.Module, Architecture], list[GateSite]]
#: granularity -> the builder of its gate sites (``GatedModel``'s gate sets; the edge
#: granularity measures through EAP's hooks instead: ``cdscope.core.granularities``)
SITE_BUILDERS: dict[str, SiteBuilder] = {
    SUBLAYER: write_sites,
    **{name: partial(unit_sites, granularity=name) for name in UNIT_KINDS},
}
