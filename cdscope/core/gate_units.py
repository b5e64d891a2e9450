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

import inspect
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from cdscope.core.gate_sites import (
    GateState,
    GateUnit,
    WriteSite,
    gate_columns,
    per_row,
    rows_first,
)
from cdscope.core.models import discovery as d
from cdscope.core.models.adapters import Architecture, Write
from cdscope.core.models.placement import execution_device
from cdscope.errors import CdscopeError

#: granularity -> {write role: how its writes are split}; roles not named keep one gate
SPLITS: dict[str, dict[str, str]] = {
    "head": {"attn": "head"},
    "expert": {"moe": "expert"},
    "neuron": {"attn": "head", "mlp": "neuron", "moe": "expert"},
}
_WHAT = {"head": "attention heads", "expert": "MoE experts", "neuron": "MLP neurons"}
_UNITS = {"head": "heads", "expert": "experts", "neuron": "neurons"}
_EXPERT_ARGS = ("hidden_states", "top_k_index", "top_k_weights")


def _wide(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.promote_types(t.dtype, torch.float32))


def out_in_weight(proj: nn.Module) -> torch.Tensor:
    """The projection's weight as ``[out, in]`` (GPT-2's Conv1D stores ``[in, out]``)."""
    weight = proj.weight
    return weight.T if type(proj).__name__ == "Conv1D" else weight


@dataclass
class SliceSite:
    """``count`` gates on equal slices (``width`` wide) of a projection's input: heads of an
    attention output projection or neurons of a down-projection."""

    start: int
    layer: int
    sublayer: str
    proj: nn.Module
    count: int
    width: int

    @property
    def units(self) -> tuple[GateUnit, ...]:
        return tuple(
            GateUnit(self.start + u, self.layer, self.sublayer, u) for u in range(self.count)
        )

    def install(self, gm: GateState) -> list[RemovableHandle]:
        return [self.proj.register_forward_pre_hook(self.hook(gm))]

    def norms(self, split: torch.Tensor) -> torch.Tensor:
        """``||slice_u W_u^T||`` per position and unit, ``[..., U]``, via the unit Grams."""
        with torch.no_grad():
            W = _wide(out_in_weight(self.proj)).to(split.device)  # noqa: N806
            x = _wide(split)
            if self.width == 1:  # neurons: a_j^2 ||W[:, j]||^2
                squares = x[..., 0] ** 2 * (W * W).sum(0)
            else:
                units = W.view(W.shape[0], self.count, self.width)
                gram = torch.einsum("oui,ouj->uij", units, units)  # [U, w, w]
                squares = (torch.einsum("...ui,uij->...uj", x, gram) * x).sum(-1)
            return squares.clamp_min(0).sqrt()

    def hook(self, gm: GateState):  # noqa: ANN201 - torch hook signature
        def hook(module: nn.Module, args: tuple) -> tuple | None:
            if gm.gates is None and gm.capture is None:
                return None
            split = args[0].unflatten(-1, (self.count, self.width))
            rows = None if gm.gates is None else gm.gates.shape[0]
            if gm.capture is not None:
                gm.capture.norms[self.start] = rows_first(self.norms(split), rows)
            if gm.gates is None:
                return None
            g = per_row(gate_columns(gm, self.start, self.start + self.count, split), split, 2)
            return ((split * g).flatten(-2), *args[1:])

        return hook


@dataclass
class ExpertSite:
    """Gates on the routed experts of one MoE write (units ``0..count-1``), set on the
    routing weights the fused experts module receives; shared experts are ``shared``."""

    start: int
    layer: int
    sublayer: str
    experts: nn.Module
    count: int
    shared: list[tuple[WriteSite, nn.Module | None]] = field(default_factory=list)

    @property
    def units(self) -> tuple[GateUnit, ...]:
        routed = (GateUnit(self.start + e, self.layer, self.sublayer, e) for e in range(self.count))
        return (*routed, *(s.units[0] for s, _ in self.shared))

    def install(self, gm: GateState) -> list[RemovableHandle]:
        handles = [self.experts.register_forward_pre_hook(self.hook(gm), with_kwargs=True)]
        for site, scale in self.shared:
            handles += site.install(gm)
            if scale is not None:  # F of the shared expert: its output times sigmoid(gate)
                handles.append(scale.register_forward_hook(_sigmoid_scale(gm, site.k)))
        return handles

    def norms(
        self, hidden: torch.Tensor, index: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """``[N, E]``: ``||w_e(x_t) f_e(x_t)||`` per token (0 where e is not routed), one
        no-grad experts call per routing slot (a token's slots hold distinct experts)."""
        wide = torch.promote_types(hidden.dtype, torch.float32)
        out = torch.zeros(hidden.shape[0], self.count, device=hidden.device, dtype=wide)
        with torch.no_grad():
            for s in range(index.shape[-1]):
                slot = index[:, s : s + 1]
                part = self.experts.forward(hidden, slot, weights[:, s : s + 1])
                norm = _wide(part).norm(dim=-1, keepdim=True).to(out.dtype)
                valid = slot < self.count
                out.scatter_add_(1, slot.clamp(max=self.count - 1), norm * valid)
        return out

    def hook(self, gm: GateState):  # noqa: ANN201 - torch hook signature
        signature = inspect.signature(self.experts.forward)

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
            if gm.gates is None and gm.capture is None:
                return None
            bound = signature.bind(*args, **kwargs)
            hidden, index, weights = (bound.arguments[a] for a in _EXPERT_ARGS)
            rows = None if gm.gates is None else gm.gates.shape[0]
            if gm.capture is not None:
                gm.capture.norms[self.start] = rows_first(self.norms(hidden, index, weights), rows)
            if gm.gates is None:
                return None
            # routers hand over fp32 weights even in fp64 models: the product takes the
            # wider dtype so the gate's gradient keeps the gate's precision (values at g = 1
            # are unchanged: the experts promote the weights to that dtype anyway)
            wide = torch.promote_types(weights.dtype, gm.gates.dtype)
            g = per_row(
                gate_columns(gm, self.start, self.start + self.count, weights.to(wide)), hidden, 1
            )
            factor = g.gather(1, index.clamp(0, self.count - 1))
            factor = torch.where(index < self.count, factor, torch.ones_like(factor))
            bound.arguments["top_k_weights"] = weights * factor
            return bound.args, bound.kwargs

        return hook


def _sigmoid_scale(gm: GateState, k: int):  # noqa: ANN202 - torch hook signature
    """Qwen2-MoE adds ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``: scale the
    captured norm of the shared expert's output by the sigmoid (it runs after it)."""

    def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        if gm.capture is not None:
            rows = None if gm.gates is None else gm.gates.shape[0]
            scale = torch.sigmoid(_wide(output))[..., 0]
            gm.capture.norms[k] = gm.capture.norms[k] * scale.reshape(rows or 1, -1)

    return hook


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
    fused = [
        m
        for n, m in sub.named_modules()
        if n and set(_EXPERT_ARGS) <= set(inspect.signature(m.forward).parameters)
    ]
    if len(fused) != 1:
        raise CdscopeError(
            f"layer {w.layer}: the MoE block {type(sub).__name__} has no fused experts module "
            f"taking ({', '.join(_EXPERT_ARGS)}); --granularity expert needs one"
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


def unit_sites(model: nn.Module, arch: Architecture, granularity: str) -> list:
    """The gate sites of ``model`` at ``granularity`` (a key of SPLITS), in gate order."""
    split = SPLITS[granularity]
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
    sites: list = []
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
