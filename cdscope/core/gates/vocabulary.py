"""The gate vocabulary every gate hook shares (SPEC §1): the gate set (``GateUnit``,
``GateSet``), the state hooks read during a gated forward (``GateState``, ``Capture``), what a
gate site is (``GateSite``) and how a block of gate columns is shaped onto a tensor
(``gate_columns``, ``per_row``, ``rows_first``). The granularity names are
``cdscope.settings.names``'; the sites are ``cdscope.core.gates.sites``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch.utils.hooks import RemovableHandle

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

    @property
    def frame_columns(self) -> dict[str, list]:
        """Columns the probe frame adds per gate at this granularity (none here; an edge
        gate set names each edge's nodes and path)."""
        return {}


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


class GateSite(Protocol):
    """One or more consecutive gates of a ``GatedModel``: the units it gates (in gate order)
    and the hooks it installs on the model, reading ``state`` during each forward."""

    @property
    def units(self) -> tuple[GateUnit, ...]: ...

    def install(self, state: GateState) -> list[RemovableHandle]: ...


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
