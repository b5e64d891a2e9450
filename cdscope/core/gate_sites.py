"""The pieces every gate hook shares (SPEC §1): the gate set (``GateUnit``, ``GateSet``), the
state hooks read during a gated forward (``GateState``, ``Capture``), how a block of gate
columns is shaped onto a tensor (``gate_columns``, ``per_row``, ``rows_first``) and the
whole-write gate (``WriteSite``). ``cdscope.core.gates.GatedModel`` owns the hooks and their
lifecycle; ``cdscope.core.gate_units`` adds the head / expert / neuron sites.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from cdscope.hooks import first_tensor, replace_first
from cdscope.settings.names import SUBLAYER


def gate_dtype(model_dtype: torch.dtype) -> torch.dtype:
    """The dtype gate tensors are built in: float64 for a float64 model, else float32
    (never bf16 / fp16: gate gradients and small gate steps need fp32 resolution; the
    hooks cast to the model's dtype at the multiplication)."""
    return torch.float64 if model_dtype == torch.float64 else torch.float32


@dataclass(frozen=True)
class GateUnit:
    """One gate: its column ``index`` in ``[B, K]`` and what it multiplies."""

    index: int
    layer: int
    sublayer: str  # the write's role: "attn" | "mlp" | "moe" | "mixer"
    unit: int | None = None  # head / expert / neuron index; None = the whole write

    @property
    def name(self) -> str:
        base = f"L{self.layer}.{self.sublayer}"
        return base if self.unit is None else f"{base}.{self.unit}"


@dataclass(frozen=True)
class GateSet:
    """The ordered gates of a model at one granularity."""

    units: tuple[GateUnit, ...]
    granularity: str = SUBLAYER

    @property
    def K(self) -> int:  # noqa: N802 - K is the SPEC's symbol
        return len(self.units)

    @property
    def layers(self) -> list[int]:
        return [u.layer for u in self.units]

    @property
    def sublayers(self) -> list[str]:
        return [u.sublayer for u in self.units]

    @property
    def names(self) -> list[str]:
        return [u.name for u in self.units]

    @property
    def unit_indices(self) -> list[int | None]:
        """Head / expert / neuron index of every gate (None for a whole write)."""
        return [u.unit for u in self.units]


@dataclass
class Capture:
    """L2 norms recorded during one gated forward: ``norms[k]`` is ``[B, T]`` for the
    single gate ``k`` or ``[B, U, T]`` for the block of gates ``k .. k + U - 1``."""

    norms: dict[int, torch.Tensor] = field(default_factory=dict)

    def stacked(self, K: int) -> torch.Tensor:  # noqa: N803
        """``[B, K, T]`` tensor of (ungated) write / unit-contribution norms."""
        device = self.norms[0].device  # writes of a dispatched model sit on several devices
        blocks = [
            (t if t.dim() == 3 else t[:, None]).to(device)
            for _, t in sorted(self.norms.items(), key=lambda item: item[0])
        ]
        out = torch.cat(blocks, dim=1)
        if out.shape[1] != K:
            raise RuntimeError(f"captured norms for {out.shape[1]} of {K} gates")
        return out


@dataclass
class GateState:
    """What the hooks of one ``GatedModel`` read during a forward: the active gates
    (``[B, K]``, or None outside ``gating``) and the norm capture (None unless asked)."""

    gates: torch.Tensor | None = None
    capture: Capture | None = None


def gate_columns(gm: GateState, start: int, stop: int, like: torch.Tensor) -> torch.Tensor:
    """``g[:, start:stop]`` on ``like``'s device and dtype (a write may sit on another device
    under a device map: its gates follow it)."""
    return gm.gates[:, start:stop].to(like.device, like.dtype)  # type: ignore[index]


def per_row(g: torch.Tensor, tensor: torch.Tensor, trailing: int) -> torch.Tensor:
    """Gates ``[rows, U]`` shaped to broadcast over ``tensor`` (``[rows, ..., *trailing]`` or
    rows flattened into ``[rows * T, *trailing]``): ``[rows, 1, ..., U]`` or ``[N, U]``,
    then ``trailing - 1`` unit axes appended (U is ``tensor``'s axis ``-trailing``)."""
    rows, lead = g.shape[0], tensor.dim() - trailing
    if tensor.shape[0] != rows:  # rows flattened to [B*T, ...] (OPT's MLP, MoE experts)
        if lead != 1 or tensor.shape[0] % rows:
            raise ValueError(f"gate rows ({rows}) != batch rows ({tensor.shape[0]})")
        g = g.repeat_interleave(tensor.shape[0] // rows, dim=0)
    else:
        g = g.view(rows, *([1] * (lead - 1)), g.shape[1])
    return g.view(*g.shape, *([1] * (trailing - 1)))


def rows_first(values: torch.Tensor, rows: int | None) -> torch.Tensor:
    """Per-position values ``[rows, T, U]`` or ``[rows * T, U]`` -> ``[rows, U, T]``."""
    if rows is None:
        rows = values.shape[0] if values.dim() > 2 else 1
    return values.reshape(rows, -1, values.shape[-1]).transpose(1, 2)


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
            g = gate_columns(gm, k, k + 1, write)[:, 0]
            if write.shape[0] != rows:  # rows flattened to [B*T, H] (OPT's MLP)
                if write.dim() != 2 or write.shape[0] % rows:
                    raise ValueError(f"gate rows ({rows}) != batch rows ({write.shape[0]})")
                g = g.repeat_interleave(write.shape[0] // rows)
            return replace_first(output, write * g.view(-1, *([1] * (write.dim() - 1))))

        return hook


def write_sites(model: nn.Module, arch) -> list[WriteSite]:  # noqa: ANN001 - an Architecture
    """One whole-write gate site per residual write of ``arch``, in gate order."""
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
