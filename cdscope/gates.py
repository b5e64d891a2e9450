"""Per-row scalar gates on every residual write (SPEC §1).

    h_{l+1} = h_l + g_attn(l) * attn_write_l + g_mlp(l) * mlp_write_l

The gate vector of one forward pass is a tensor ``g`` of shape ``[B, K]``: row ``b``
carries the gates used for batch row ``b``, so one batched forward can carry different
gate settings per row (families, +/- perturbations). Gate ``k`` of a sublayer gate set
is the position of the write in the model's architecture description (blocks in order,
writes of a block in call order): ``2*l`` for the attention write of layer ``l`` and
``2*l + 1`` for its MLP write in an ordinary decoder (K = 2L); hybrid blocks may have
other counts and roles (``cdscope.models.adapters``).

Mechanism: a forward hook on each write module (discovered and proven at load by
``cdscope.models.adapters.architecture_of``)
multiplies the module's output by ``g[:, k]``. With ``g = 1`` the multiplication is an
exact floating-point identity, so the gated model reproduces the ungated one bit for bit;
``g_k = 0`` removes exactly that write. Both facts are tested in ``tests/test_gates.py``.

The hooks belong to a ``GatedModel`` context object: they are installed on ``__enter__``
and always removed on ``__exit__``, exceptions included. Outside ``GatedModel.gating``
the hooks pass outputs through untouched.

Granularity: a ``GateSet`` maps each gate index to a ``GateUnit`` (layer, sublayer and,
at finer granularities, a head, expert or neuron index). Estimators only ever see
``[B, K]`` tensors and the ``GateSet``. ``GatedModel(model, granularity=...)`` takes the
name of a granularity (``GRANULARITIES``); the sites of the finer ones (forward pre-hooks
on output projections and on MoE expert weights) live in ``cdscope.gate_units``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from cdscope.frames import GRANULARITIES
from cdscope.models.adapters import Architecture, architecture_of


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
    granularity: str = "sublayer"

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


def gate_columns(gm: GatedModel, start: int, stop: int, like: torch.Tensor) -> torch.Tensor:
    """``g[:, start:stop]`` on ``like``'s device and dtype (a write may sit on another device
    under a device map: its gates follow it)."""
    return gm._gates[:, start:stop].to(like.device, like.dtype)  # type: ignore[index]


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


def first_tensor(output: object) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output  # type: ignore[index,return-value]


def replace_first(output: object, tensor: torch.Tensor) -> object:
    return (tensor, *output[1:]) if isinstance(output, tuple) else tensor  # type: ignore[index]


class GatedModel:
    """Owns the gate hooks of one causal LM.

    Usage::

        with GatedModel(model) as gm:
            with gm.gating(torch.ones(B, gm.gate_set.K), capture_norms=True) as cap:
                out = model(input_ids)
    """

    def __init__(
        self,
        model: nn.Module,
        architecture: Architecture | None = None,
        granularity: str = "sublayer",
    ) -> None:
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        self.model = model
        self.architecture = architecture or architecture_of(model)  # discovered + proven
        writes = self.architecture.write_modules(model)
        if granularity == "sublayer":
            self._sites: list = [
                WriteSite(k, layer, sub, m) for k, (layer, sub, m) in enumerate(writes)
            ]
        else:
            from cdscope.gate_units import unit_sites

            self._sites = unit_sites(model, self.architecture, granularity)
        self.gate_set = GateSet(tuple(u for site in self._sites for u in site.units), granularity)
        self._handles: list[RemovableHandle] = []
        self._gates: torch.Tensor | None = None
        self._capture: Capture | None = None

    # -- hook lifecycle -------------------------------------------------------------
    def __enter__(self) -> GatedModel:
        if self._handles:
            raise RuntimeError("GatedModel hooks are already installed")
        for site in self._sites:
            self._handles += site.install(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._gates = None
        self._capture = None

    @contextmanager
    def gating(self, gates: torch.Tensor | None, capture_norms: bool = False) -> Iterator[Capture]:
        """Apply ``gates`` (``[B, K]``, or None for no gating) to forwards run inside the block."""
        if not self._handles:
            raise RuntimeError("use GatedModel as a context manager before gating")
        if gates is not None and (gates.dim() != 2 or gates.shape[1] != self.gate_set.K):
            raise ValueError(
                f"gates must have shape [B, {self.gate_set.K}], got {tuple(gates.shape)}"
            )
        capture = Capture()
        self._gates, self._capture = gates, (capture if capture_norms else None)
        try:
            yield capture
        finally:
            self._gates, self._capture = None, None


@dataclass
class WriteSite:
    """One gate on a whole write: a forward hook multiplies the write module's output by
    ``g[:, k]`` (and records its norm per position when norms are captured)."""

    k: int
    layer: int
    sublayer: str
    module: nn.Module
    unit: int | None = None  # a shared MoE expert is a unit of its write

    @property
    def units(self) -> tuple[GateUnit, ...]:
        return (GateUnit(self.k, self.layer, self.sublayer, self.unit),)

    def install(self, gm: GatedModel) -> list[RemovableHandle]:
        return [self.module.register_forward_hook(self.hook(gm))]

    def hook(self, gm: GatedModel):  # noqa: ANN201 - torch hook signature
        k = self.k

        def hook(module: nn.Module, args: tuple, output: object) -> object | None:
            write = first_tensor(output)
            rows = None if gm._gates is None else gm._gates.shape[0]
            if gm._capture is not None:
                wide = write.detach().to(torch.promote_types(write.dtype, torch.float32))
                norms = wide.norm(dim=-1)
                gm._capture.norms[k] = norms if rows is None else norms.reshape(rows, -1)
            if gm._gates is None:
                return None
            g = gate_columns(gm, k, k + 1, write)[:, 0]
            if write.shape[0] != rows:  # rows flattened to [B*T, H] (OPT's MLP)
                if write.dim() != 2 or write.shape[0] % rows:
                    raise ValueError(f"gate rows ({rows}) != batch rows ({write.shape[0]})")
                g = g.repeat_interleave(write.shape[0] // rows)
            return replace_first(output, write * g.view(-1, *([1] * (write.dim() - 1))))

        return hook
