"""The gate sites (SPEC §1; each a ``GateSite``): a whole write (``WriteSite``: a forward hook
on the write module), equal slices of an output projection's input (``SliceSite``: heads or
neurons, a forward pre-hook) and the routed experts of a fused MoE module (``ExpertSite``:
the routing weights it receives, with shared experts as ``WriteSite`` units). Why each is
exact and how F of a unit is computed: ``cdscope.core.gating.units``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from cdscope.core.gates.vocabulary import (
    GateState,
    GateUnit,
    gate_columns,
    per_row,
    rows_first,
)
from cdscope.hooks import first_tensor, replace_first

#: the arguments of a fused experts module's forward (transformers' 3D-parameter experts)
EXPERT_ARGS = ("hidden_states", "top_k_index", "top_k_weights")


def fused_experts(module: nn.Module) -> bool:
    """Whether ``module`` is a fused experts module: its forward takes ``EXPERT_ARGS``."""
    try:
        return set(EXPERT_ARGS) <= set(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):  # a forward without a readable signature (a C builtin)
        return False


@dataclass
class WriteSite:
    """One gate on a whole write: a forward hook multiplies the write module's output by
    ``g[:, k]`` (and records its norm per position when norms are captured)."""

    k: int
    layer: int
    sublayer: str
    module: nn.Module
    unit: int | None = None  # a shared MoE expert is a unit of its write
    #: several residual streams (``cdscope.core.models.streams``): the module whose output
    #: element ``expand_index`` holds the stream weights ``e`` the write enters them with
    expand: nn.Module | None = None
    expand_index: int = 0
    _weights: list = field(default_factory=list, repr=False)  # e of the current forward

    @property
    def units(self) -> tuple[GateUnit, ...]:
        return (GateUnit(self.k, self.layer, self.sublayer, self.unit),)

    def install(self, gm: GateState) -> list[RemovableHandle]:
        handles = []
        if self.expand is not None:

            def keep(module: nn.Module, args: tuple, output: object) -> None:
                self._weights[:] = [output[self.expand_index].detach()]

            handles.append(self.expand.register_forward_hook(keep))
        return [*handles, self.module.register_forward_hook(self.hook(gm))]

    def hook(self, gm: GateState):  # noqa: ANN201 - torch hook signature
        k = self.k

        def hook(module: nn.Module, args: tuple, output: object) -> object | None:
            write = first_tensor(output)
            rows = None if gm.gates is None else gm.gates.shape[0]
            if gm.capture is not None:
                wide = write.detach().to(torch.promote_types(write.dtype, torch.float32))
                norms = wide.norm(dim=-1)
                if self.expand is not None:  # |e (x) w| = |e| |w| at each position
                    norms = norms * self._weights[0].to(norms).norm(dim=-1)
                gm.capture.norms[k] = norms if rows is None else norms.reshape(rows, -1)
            if gm.gates is None:
                return None
            # rows may be flattened to [B*T, H] (OPT's MLP): per_row repeats each row's gate
            g = per_row(gate_columns(gm, k, k + 1, write), write, 1)
            return replace_first(output, write * g)

        return hook


def write_sites(model: nn.Module, arch) -> list[WriteSite]:  # noqa: ANN001 - an Architecture
    """One gate per residual write of ``arch`` (a ``core.models.architecture.Architecture``,
    not imported: sites sit below the models tier, whose proof installs them), in gate
    order (the sublayer gate set)."""
    return [
        WriteSite(
            k,
            w.layer,
            w.role,
            model.get_submodule(w.path),
            expand=model.get_submodule(w.expand) if w.expand else None,
            expand_index=w.expand_index,
        )
        for k, w in enumerate(arch.writes)
    ]


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
            hidden, index, weights = (bound.arguments[a] for a in EXPERT_ARGS)
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
