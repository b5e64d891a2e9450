"""Expert routing held fixed in perturbed forwards (SPEC §2's fd twin, §5's proxy gradients).

**Why.** An MoE block's router picks, per token, the top-k experts of its scores. That
choice is piecewise constant in the block's input; autograd differentiates the branch
the nominal forward took (``torch.topk``'s backward sends the gradient to the selected
values: the indices are constants). A difference quotient does not: the fd twin of C
(``control.control_finite_difference``) and the proxy / folded / Richardson regulariser
(``regularizer.proxy_grad``) run forwards at gates 1 ± h, and where a token's scores sit
near a tie the perturbed forward routes it to other experts, so the quotient measures a
jump instead of the derivative (tiny float64 Mixtral at the default h = 1e-2: C off by
4.7x; docs/probe.md).

**Holding.** ``RoutingHold(model)`` finds the MoE blocks and, inside ``with hold:``, hooks
them. In a ``nominal(batch, rows)`` block (the g = 1 forward) every ``torch.topk`` /
``Tensor.topk`` call inside an MoE block's forward runs as usual and its indices are
recorded per batch row and position (call by call: DeepSeek-V3's router makes three, the
top-2 of each expert group, the groups, the experts). In a ``perturbed(batch, rows)``
block each such call returns the recorded indices ``I`` and the values of its own
(perturbed) input at them, ``input.gather(dim, I)``: the routing weights are still
computed from the perturbed router logits, over the experts the nominal forward chose.
That is the function autograd differentiates, so a difference quotient of it converges
to autograd's derivative; for the regulariser, the weights stay differentiable in the
router's parameters exactly as in an autograd forward. Rows are looked up by batch row,
so a perturbed forward may group rows differently from the nominal one (a row repeated
for several gate settings, other padding widths).

**Counts** (``RoutingCount``): per (MoE block, real token) of a perturbed forward,
``switched`` when any top-k call would have chosen another index set than the held one
(the branch the perturbation crosses), and ``unheld`` when the fused experts module
(``gates.sites.fused_experts``) received other expert indices than in the nominal
forward — routing that this interception does not reach (PhiMoE's sparsemixer selects
with ``max`` and thresholds; measured in tests/core/test_routing.py). Hash routing by
token id (DeepSeek-V4's first layers) does not depend on the gates and needs no holding.
A recomputation of the same forward (activation checkpointing) replays the same routing
and is not counted twice.

**Which blocks** (module structure, no names): the parent of every fused experts module
(``forward(hidden_states, top_k_index, top_k_weights)``: Mixtral, Qwen2/3-MoE, OLMoE,
DeepSeek-V3, Jamba and 40-odd more in transformers 5.23), and the sublayer of each
``moe`` write of the proven architecture (GPT-OSS, Llama-4: experts with another
interface), outermost first (DBRX's and LongCat's ``moe`` write is the experts module;
their router is its sibling, so the parent is held).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from cdscope.core.batch import ProbeBatch
from cdscope.core.gates.sites import EXPERT_ARGS, fused_experts
from cdscope.core.models.architecture import Architecture
from cdscope.errors import CdscopeError
from cdscope.hooks import HookSet

_TOPK = (torch.topk, torch.Tensor.topk)


@dataclass(frozen=True)
class RoutingCount:
    """Routing decisions (MoE block x real token) of perturbed forwards (module doc)."""

    decisions: int = 0
    switched: int = 0  # the perturbation would have picked other experts; held
    unheld: int = 0  # the experts received other indices than nominal: not held

    def __add__(self, other: RoutingCount) -> RoutingCount:
        return RoutingCount(
            self.decisions + other.decisions,
            self.switched + other.switched,
            self.unheld + other.unheld,
        )

    def describe(self) -> str:
        """'3 of 240 routing decisions switched (held)' (and the unheld ones)."""
        text = f"{self.switched} of {self.decisions} routing decisions switched (held)"
        return text + (f", {self.unheld} not held" if self.unheld else "")


@dataclass
class _Forward:
    """The rows of the forward running now: batch rows, padded width, real-token mask."""

    rows: torch.Tensor
    width: int
    real: torch.Tensor  # [len(rows) * width] bool, row-major like the blocks' token axis
    record: bool


class _Block:
    """One MoE block: its recorded top-k indices and experts' indices, per batch row."""

    def __init__(self, name: str, module: nn.Module, batch_rows: int, max_width: int) -> None:
        self.name, self.module = name, module
        self.experts = next((m for m in module.modules() if fused_experts(m)), None)
        self.signature = inspect.signature(self.experts.forward) if self.experts else None
        self.shape = (batch_rows, max_width)
        self.recorded: dict[int, torch.Tensor] = {}  # call -> [B, T, ...]
        self.routed: torch.Tensor | None = None  # experts' top_k_index, [B, T, k]
        self.calls = 0
        #: this perturbed forward's decisions are counted (a recomputation: not again)
        self.counted = False
        self.switched: torch.Tensor | None = None  # [N] bool, the forward now running

    # -- storage by batch row ------------------------------------------------------------
    def _per_row(self, values: torch.Tensor, now: _Forward) -> torch.Tensor:
        """``values`` with the token axes as ``[rows, width, ...]``: flat ``[rows * width,
        ...]`` (most routers) or already ``[rows, width, ...]`` (Zaya's)."""
        rows, width = len(now.rows), now.width
        if values.shape[0] == rows * width:
            return values.reshape(rows, width, *values.shape[1:])
        if values.dim() >= 2 and tuple(values.shape[:2]) == (rows, width):
            return values
        raise CdscopeError(
            f"cannot hold the expert routing of {self.name} ({type(self.module).__name__}): "
            f"it routes tensors of shape {tuple(values.shape)} in a forward of {rows} x "
            f"{width} tokens; use --estimator autograd"
        )

    def _store(self, store: torch.Tensor | None, values: torch.Tensor, now: _Forward):  # noqa: ANN202
        shaped = self._per_row(values, now)
        if store is None or store.shape[2:] != shaped.shape[2:]:
            store = shaped.new_zeros(*self.shape, *shaped.shape[2:])
        store[now.rows.to(store.device), : now.width] = shaped
        return store

    def _held(self, store: torch.Tensor, now: _Forward) -> torch.Tensor:
        """The recorded values of this forward's rows, ``[rows, width, ...]``."""
        return store[now.rows.to(store.device), : now.width]

    # -- the hooks -----------------------------------------------------------------------
    def topk(self, now: _Forward, func, args: tuple, kwargs: dict):  # noqa: ANN001, ANN201
        """One top-k call inside the block: recorded (nominal) or held (perturbed)."""
        natural = func(*args, **kwargs)
        call, self.calls = self.calls, self.calls + 1
        if now.record:
            self.recorded[call] = self._store(self.recorded.get(call), natural.indices, now)
            return natural
        if call not in self.recorded:
            raise CdscopeError(
                f"the expert routing of {self.name} made more top-k calls in a perturbed "
                "forward than in the nominal one; use --estimator autograd"
            )
        held = self._held(self.recorded[call], now).to(natural.indices.device)
        differs = _differs(self._per_row(natural.indices, now), held)
        self.switched = self.switched | differs if self.switched is not None else differs
        held = held.reshape(natural.indices.shape)  # the layout the call returned
        source = args[0] if args else kwargs["input"]
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
        return torch.return_types.topk((source.gather(dim, held), held))

    def experts_input(self, now: _Forward, args: tuple, kwargs: dict) -> torch.Tensor | None:
        """The experts' ``top_k_index`` recorded (nominal); per token, whether it differs
        from the nominal one (perturbed)."""
        index = self.signature.bind(*args, **kwargs).arguments[EXPERT_ARGS[1]]
        if now.record:
            self.routed = self._store(self.routed, index, now)
            return None
        held = self._held(self.routed, now).to(index.device)
        return _differs(self._per_row(index, now), held)


def _differs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[rows * width]``: whether a token chose other indices in ``a`` than in ``b`` (both
    ``[rows, width, ...]``), as sets along the last axis, whatever order the kernel
    returned them in."""
    tokens = a.shape[0] * a.shape[1]
    a, b = (x.sort(dim=-1).values.reshape(tokens, -1) for x in (a, b))
    return (a != b).any(dim=-1)


class _Interception(TorchFunctionMode):
    """Sends every top-k call made inside one block's forward to that block."""

    def __init__(self, block: _Block, now: _Forward) -> None:
        super().__init__()
        self.block, self.now = block, now

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func in _TOPK:
            return self.block.topk(self.now, func, args, kwargs or {})
        return func(*args, **(kwargs or {}))


def moe_blocks(model: nn.Module, architecture: Architecture | None = None) -> list[str]:
    """Names of the modules whose forward routes tokens to experts (module doc): parents of
    fused experts modules and the sublayers of ``moe`` writes, outermost only."""
    found = {
        parent
        for parent, module in model.named_modules()
        if any(fused_experts(child) for child in module.children())
    }
    if architecture is not None:
        found |= {w.sublayer for w in architecture.writes if w.role == "moe"}
    return sorted(n for n in found if not any(n.startswith(f"{o}.") for o in found if o != n))


class RoutingHold:
    """Records the nominal forward's expert routing and holds it in perturbed forwards.

    Usage (module doc)::

        with RoutingHold(model, batch, architecture) as hold:
            with gm.gating(ones), hold.nominal(batch, rows):
                ...                                   # g = 1: routing recorded
            with gm.gating(perturbed), hold.perturbed(batch, rows):
                ...                                   # routing replayed, switches counted
        hold.count                                    # RoutingCount

    A model without MoE blocks gets no hooks and no counts (``bool(hold)`` is False).
    """

    def __init__(
        self, model: nn.Module, batch: ProbeBatch, architecture: Architecture | None = None
    ) -> None:
        shape = (batch.B, int(batch.input_ids.shape[1]))
        self.blocks = [
            _Block(n, model.get_submodule(n), *shape) for n in moe_blocks(model, architecture)
        ]
        self._hooks = HookSet("RoutingHold")
        self._now: _Forward | None = None
        self._modes: dict[int, _Interception] = {}
        self._recorded = torch.zeros(batch.B, dtype=torch.bool)  # rows of a nominal forward
        self.count = RoutingCount()

    def __bool__(self) -> bool:
        return bool(self.blocks)

    def __enter__(self) -> RoutingHold:
        self._hooks.install(self._register)
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.remove()

    def _register(self, hooks: HookSet) -> None:
        for i, block in enumerate(self.blocks):
            hooks.forward_pre(block.module, self._enter(i))
            hooks.add(block.module.register_forward_hook(self._leave(i), always_call=True))
            if block.experts is not None:
                hooks.forward_pre(block.experts, self._routed(i), with_kwargs=True)

    def _enter(self, i: int):  # noqa: ANN202 - torch hook signature
        def hook(module: nn.Module, args: tuple) -> None:
            if self._now is None:
                return
            block = self.blocks[i]
            block.calls, block.switched = 0, None
            self._modes[i] = _Interception(block, self._now)
            self._modes[i].__enter__()

        return hook

    def _leave(self, i: int):  # noqa: ANN202 - torch hook signature
        def hook(module: nn.Module, args: tuple, output: object) -> None:
            mode = self._modes.pop(i, None)
            if mode is None:
                return
            mode.__exit__(None, None, None)
            block, now = self.blocks[i], self._now
            if now.record:
                if block.calls == 0 and block.experts is None:
                    raise CdscopeError(
                        f"cannot hold the expert routing of {block.name} "
                        f"({type(block.module).__name__}): it makes no top-k call and has no "
                        "fused experts module to check; use --estimator autograd"
                    )
                return
            if block.counted:
                return
            block.counted = True
            real = now.real.to(block.switched.device) if block.switched is not None else now.real
            switched = int((block.switched & real).sum()) if block.switched is not None else 0
            self.count += RoutingCount(int(now.real.sum()), switched, 0)

        return hook

    def _routed(self, i: int):  # noqa: ANN202 - torch hook signature
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            now = self._now
            if now is None or i not in self._modes:
                return
            differs = self.blocks[i].experts_input(now, args, kwargs)
            if differs is not None and not self.blocks[i].counted:
                unheld = int((differs & now.real.to(differs.device)).sum())
                self.count += RoutingCount(0, 0, unheld)

        return hook

    @contextmanager
    def _forward(self, batch: ProbeBatch, rows: torch.Tensor, record: bool) -> Iterator[None]:
        if not self.blocks:
            yield
            return
        rows = rows.cpu()
        if record:
            self._recorded[rows] = True
        elif not bool(self._recorded[rows].all()):
            raise RuntimeError("RoutingHold.perturbed: a row without a nominal forward")
        width = int(batch.lengths[rows].max())
        real = (torch.arange(width)[None, :] < batch.lengths[rows][:, None]).reshape(-1)
        self._now = _Forward(rows, width, real, record)
        for block in self.blocks:
            block.counted = False
        try:
            yield
        finally:
            self._now = None

    def nominal(self, batch: ProbeBatch, rows: torch.Tensor):  # noqa: ANN201
        """Context of the g = 1 forward of batch ``rows``: routing recorded."""
        return self._forward(batch, rows, record=True)

    def perturbed(self, batch: ProbeBatch, rows: torch.Tensor):  # noqa: ANN201
        """Context of a perturbed forward of batch ``rows`` (a backward inside it included):
        the recorded routing held, switches counted."""
        return self._forward(batch, rows, record=False)
