"""Per-row scalar gates on every residual write (SPEC §1).

    h_{l+1} = h_l + g_attn(l) * attn_write_l + g_mlp(l) * mlp_write_l

The gate vector of one forward pass is a tensor ``g`` of shape ``[B, K]``: row ``b``
carries the gates used for batch row ``b``, so one batched forward can carry different
gate settings per row (families, +/- perturbations). Gate ``k`` of a sublayer gate set
is the position of the write in the model's architecture description (blocks in order,
writes of a block in call order): ``2*l`` for the attention write of layer ``l`` and
``2*l + 1`` for its MLP write in an ordinary decoder (K = 2L); hybrid blocks may have
other counts and roles (``cdscope.core.models.architecture``).

Mechanism: a forward hook on each write module (discovered and proven at load by
``cdscope.core.models.architecture.architecture_of``)
multiplies the module's output by ``g[:, k]``. With ``g = 1`` the multiplication is an
exact floating-point identity, so the gated model reproduces the ungated one bit for bit;
``g_k = 0`` removes exactly that write. Both facts are tested in ``tests/core/test_gates.py``.

The hooks belong to a ``GatedModel`` context object: they are installed on ``__enter__``
and always removed on ``__exit__``, exceptions included. Outside ``GatedModel.gating``
the hooks pass outputs through untouched.

Granularity: a ``GateSet`` maps each gate index to a ``GateUnit`` (layer, sublayer and,
at finer granularities, a head, expert or neuron index). Estimators only ever see
``[B, K]`` tensors and the ``GateSet``. ``GatedModel(model, granularity=...)`` takes the
name of a granularity (``GATE_GRANULARITIES``); its sites come from
``cdscope.core.gating.units.SITE_BUILDERS`` (forward hooks on whole writes; forward
pre-hooks on output projections and on MoE expert weights at the finer ones).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from cdscope.core.gates.vocabulary import Capture, GateSet, GateSite, GateState
from cdscope.core.gating.units import SITE_BUILDERS
from cdscope.core.models.architecture import Architecture, architecture_of
from cdscope.errors import CdscopeError
from cdscope.hooks import HookSet
from cdscope.settings.names import GATE_GRANULARITIES, SUBLAYER


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
        granularity: str = SUBLAYER,
    ) -> None:
        if granularity not in GATE_GRANULARITIES:
            raise ValueError(
                f"granularity must be one of {GATE_GRANULARITIES}, got {granularity!r}"
            )
        self.model = model
        self.architecture = architecture or architecture_of(model)  # discovered + proven
        self._sites: list[GateSite] = SITE_BUILDERS[granularity](model, self.architecture)
        self.gate_set = GateSet(tuple(u for site in self._sites for u in site.units), granularity)
        self._hooks = HookSet("GatedModel")
        self.state = GateState()

    # -- hook lifecycle -------------------------------------------------------------
    def __enter__(self) -> GatedModel:
        self._hooks.install(
            lambda hooks: [hooks.add(h) for site in self._sites for h in site.install(self.state)]
        )
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._hooks.remove()
        self.state = GateState()

    @contextmanager
    def gating(self, gates: torch.Tensor | None, capture_norms: bool = False) -> Iterator[Capture]:
        """Apply ``gates`` (``[B, K]``, or None for no gating) to forwards run inside the block.

        Run the backward of a gated forward inside the block too: activation checkpointing
        recomputes the forward during the backward, and the recomputation must apply the same
        gates (leaving the block clears them)."""
        if not self._hooks.installed:
            raise RuntimeError("use GatedModel as a context manager before gating")
        if gates is not None and (gates.dim() != 2 or gates.shape[1] != self.gate_set.K):
            raise ValueError(
                f"gates must have shape [B, {self.gate_set.K}], got {tuple(gates.shape)}"
            )
        if gates is not None and torch.is_grad_enabled():
            refuse_reentrant_checkpointing(self.model)
        capture = Capture()
        self.state.gates, self.state.capture = gates, (capture if capture_norms else None)
        try:
            yield capture
        finally:
            self.state.gates, self.state.capture = None, None


def refuse_reentrant_checkpointing(model: nn.Module) -> None:
    """One line instead of a wrong gradient: transformers' activation checkpointing in its
    reentrant form (``use_reentrant=True``) is active on ``model``.

    A reentrant checkpoint recomputes its block from the block's inputs alone; the gates are
    not among them, so ``torch.autograd.grad`` w.r.t. the gates -- C, the exact gradient --
    cannot be taken (torch raises). The non-reentrant form gives C, the exact and the
    first-order gradients bit for bit (tests/train/test_engine.py), because every estimator
    runs its backward inside ``gating``, where the recomputation applies the same gates.
    transformers checkpoints only in training mode."""
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True and module.training:
            func = getattr(module, "_gradient_checkpointing_func", None)
            if getattr(func, "keywords", {}).get("use_reentrant", True) is not False:
                raise CdscopeError(
                    "reentrant activation checkpointing is on (use_reentrant=True): the gate "
                    "gradients cannot run through it; enable it with use_reentrant=False "
                    "(cdscope train --activation-checkpointing does)"
                )
