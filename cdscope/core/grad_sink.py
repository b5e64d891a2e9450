"""Parameter gradients of an estimator's per-chunk objectives, with no silent zero.

Two ways a gradient reaches a parameter:

* an unsharded model: ``torch.autograd.grad`` of each chunk's objective w.r.t. the
  parameters, summed by ``GradSink`` (the caller's ``.grad`` untouched);
* an FSDP2-sharded model (``distributed.is_sharded``): the forward runs on all-gathered
  copies, so autograd never reaches the DTensor shards (``autograd.grad`` returns None);
  each chunk's objective goes through ``backward()`` and FSDP reduce-scatters it into the
  shards' ``.grad``.

``torch.autograd.grad(..., allow_unused=True)`` answers None for a parameter the objective
does not reach. Turned into zeros, that made a sharded model's whole regulariser gradient
zero without a word; here it is a one-line ``CdscopeError`` naming the parameters
(``require_reached``), used by the regulariser's estimators and by the training step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from cdscope.distributed import is_sharded
from cdscope.errors import CdscopeError


class GradSink:
    """Sums the parameter gradients of an estimator's per-chunk objectives, and refuses to
    return a silent zero.

    Unsharded model: ``torch.autograd.grad`` of each chunk's objective w.r.t. ``params``,
    summed here (the caller's ``.grad`` untouched). FSDP2-sharded model
    (``distributed.is_sharded``): the forward ran on all-gathered copies, so autograd does not
    reach the DTensor shards; each chunk's objective goes through ``backward()`` and FSDP
    reduce-scatters it into the shards' ``.grad`` (the mean over ranks, which all run the same
    probe: the gradient itself). The caller's ``.grad`` of every parameter are set aside first
    and restored at the end, so only the estimator's gradient is read.

    A parameter that no chunk's gradient reached (autograd's None) is an error naming it,
    never a zero: under FSDP that is a forward that bypassed the sharded module's own
    forward; otherwise a parameter that takes no part in the probe's log-likelihood.
    """

    def __init__(self, model: nn.Module, params: list[nn.Parameter], what: str) -> None:
        self.model, self.params, self.what = model, params, what
        self.sharded = is_sharded(model)
        self.grads: list[torch.Tensor] = (
            [] if self.sharded else [torch.zeros_like(p) for p in params]
        )
        self.reached = [False] * len(params)
        self.kept: list[tuple[nn.Parameter, torch.Tensor | None]] = []

    def __enter__(self) -> GradSink:
        if self.sharded:
            self.kept = [(p, p.grad) for p in self.model.parameters()]
            for p, _ in self.kept:
                p.grad = None
        return self

    def add(self, output: torch.Tensor) -> None:
        """Add the gradient of the scalar ``output`` (its graph is freed)."""
        if self.sharded:
            output.backward()
            return
        grads = torch.autograd.grad(output, self.params, allow_unused=True)
        for i, g in enumerate(grads):
            if g is not None:
                self.grads[i].add_(g)
                self.reached[i] = True

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self.sharded:
            self.grads = [p.grad for p in self.params]  # type: ignore[misc]
            self.reached = [g is not None for g in self.grads]
            for p, kept in self.kept:
                p.grad = kept
        if exc_type is None:
            require_reached(self.model, self.params, self.reached, self.what)


def require_reached(
    model: nn.Module, params: Sequence[nn.Parameter], reached: Sequence[bool], what: str
) -> None:
    """One ``CdscopeError`` line naming the parameters a gradient should have reached and
    did not (``reached[i]`` False), instead of a zero standing in for the missing gradient."""
    from torch.distributed.tensor import DTensor

    missing = [p for p, ok in zip(params, reached, strict=True) if not ok]
    if not missing:
        return
    names = {id(p): n for n, p in model.named_parameters()}
    listed = ", ".join(names.get(id(p), f"<unnamed {tuple(p.shape)}>") for p in missing[:3])
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    if is_sharded(model):
        cause = (
            "under FSDP2 a gradient reaches a shard only through a backward of the root "
            "module's own forward: run forwards through model(...) and detach no module output"
        )
    elif any(isinstance(p, DTensor) for p in missing):
        cause = (
            "they are FSDP2 shards under an unsharded root: fully_shard the root module too, "
            "so the forward all-gathers and the backward reduce-scatters for them"
        )
    else:
        cause = (
            "they take no part in the loss as computed; freeze them (requires_grad=False) "
            "or leave them out of the parameters"
        )
    raise CdscopeError(
        f"{what}: no gradient reached {len(missing)} trainable parameter(s) ({listed}{more}), "
        f"which a zero would leave silently untrained; {cause}"
    )


def gate_gradient(
    objective: torch.Tensor, gates: torch.Tensor, create_graph: bool = False
) -> torch.Tensor:
    """d objective / d gates (the probe's gate backward, SPEC §2), or one line when the
    forward applied none of the gates -- a forward that bypassed every gate hook (a module
    replaced, hooks removed, a compiled graph) would otherwise end in a traceback."""
    (grad,) = torch.autograd.grad(objective, gates, allow_unused=True, create_graph=create_graph)
    if grad is None:
        raise CdscopeError(
            "the probe's gate gradient: no gate was applied in the forward (no gate hook ran); "
            "run the probe through the model GatedModel hooked, inside gm.gating(...)"
        )
    return grad
