"""The memory engines of an hf-loop run: activation checkpointing and FSDP2 sharding.

**Activation checkpointing** (``--activation-checkpointing``, ``checkpoint_blocks``): the
forward of every decoder block runs under ``torch.utils.checkpoint`` with
``use_reentrant=False``, which keeps only the block's inputs and recomputes the rest during
the backward. Only the block's ``forward`` is wrapped (as transformers does): hooks on the
block itself (FSDP2's all-gather) stay outside the recomputation, hooks on its submodules
(cdscope's gates) run again inside it. So the gates must still be set while the backward
runs: every estimator takes its backward inside ``GatedModel.gating`` (core/gating/model.py), and
the recomputed gated forward is the forward it replaces, bit for bit. Reentrant
checkpointing cannot give ``autograd.grad`` w.r.t. the gates and silently corrupts the
folded gradient; ``GatedModel.gating`` refuses it. Nothing happens under ``no_grad``
(rollouts keep their KV cache).

**Sharding** (``--sharding fsdp``, under ``torchrun``; ``shard``): torch's FSDP2
``fully_shard`` on each decoder block, then on the root (the causal LM, which then holds the
embedding, final norm and head). Parameters become DTensor shards, all-gathered block by
block inside the root's forward; ``backward`` reduce-scatters gradients into the shards'
``.grad`` as the **mean** over ranks. What each part of a step does with that:

* rollouts: every rank samples the whole step's batch from the same seed with the model
  gathered once (``gathered``) -- identical on every rank, so ranks stay in lock step and
  the run equals one process; rewards too;
* GRPO backward: rank r takes its 1/W of the completions (``Shards.share``); its token sum
  over the step's token count is scaled by W so that FSDP's mean is the step's sum;
* the probe runs through the root forward (``core.likelihood``), every rank on the whole
  probe: C is the same on every rank, and the regulariser's backward (``core.regularizer``)
  reaches the shards through FSDP, whose mean over identical gradients is lambda grad R
  itself, counted once;
* checkpoints and the final model: full (unsharded) state dicts gathered on rank 0, which
  alone writes (``full_states`` / ``load_full_states``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cdscope.core.models.architecture import architecture_of
from cdscope.distributed import held_unsharded, is_sharded
from cdscope.errors import CdscopeError


def checkpoint_blocks(model: nn.Module) -> int:
    """Wrap every decoder block's forward in non-reentrant checkpointing (see the module
    docstring); returns the number of blocks. Wrapping twice is refused."""
    from torch.utils.checkpoint import checkpoint

    blocks = architecture_of(model).layers(model)
    for block in blocks:
        if getattr(block, "_cdscope_checkpointed", False):
            raise CdscopeError("activation checkpointing is already on for this model")
        forward = block.forward

        @functools.wraps(forward)
        def checkpointed(*args: Any, _forward: Any = forward, **kwargs: Any) -> Any:
            if not torch.is_grad_enabled():
                return _forward(*args, **kwargs)
            return checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        block.forward = checkpointed
        block._cdscope_checkpointed = True
    return len(blocks)


def blocks_checkpointed(model: nn.Module) -> bool:
    """Whether ``checkpoint_blocks`` wrapped this model's blocks, or Hugging Face's own
    gradient checkpointing is on (either reruns block forwards in the backward)."""
    return any(
        getattr(m, "_cdscope_checkpointed", False)
        or getattr(m, "gradient_checkpointing", False) is True
        for m in model.modules()
    )


@dataclass(frozen=True)
class Shards:
    """This process's place in a sharded run (rank 0 of 1 when unsharded)."""

    rank: int = 0
    world: int = 1
    sharded: bool = False

    def share(self, n: int) -> slice:
        """Rank r's contiguous 1/W of ``n`` rows (``n`` divisible by W, checked up front)."""
        size = n // self.world
        return slice(self.rank * size, (self.rank + 1) * size)

    def total(self, values: Sequence[float]) -> list[float]:
        """Sums over ranks of ``values`` (float64)."""
        if not self.sharded:
            return list(values)
        import torch.distributed as dist

        box = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(box)
        return box.tolist()

    def from_rank_zero(self, value: float) -> float:
        """Rank 0's ``value``: every rank takes the same branch (a projection loop whose
        length differed between ranks would leave FSDP's collectives unmatched)."""
        if not self.sharded:
            return value
        import torch.distributed as dist

        box = torch.tensor([value], dtype=torch.float64)
        dist.broadcast(box, src=0)
        return float(box.item())

    def all(self, flag: bool) -> bool:
        """True on every rank when ``flag`` holds on every rank."""
        if not self.sharded:
            return flag
        import torch.distributed as dist

        box = torch.tensor([1 if flag else 0], dtype=torch.int64)
        dist.all_reduce(box, op=dist.ReduceOp.MIN)
        return bool(box.item())


def shards_of(params: Sequence[nn.Parameter]) -> Shards:
    """The ``Shards`` of a run training ``params`` (sharded: DTensor parameters, as FSDP2
    makes them -- ours or accelerate's)."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in params):
        return Shards()
    import torch.distributed as dist

    return Shards(dist.get_rank(), dist.get_world_size(), True)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor; any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The full value of a DTensor (a collective); any other tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def shard(model: nn.Module, *others: nn.Module) -> None:
    """FSDP2 ``fully_shard`` on each decoder block of ``model`` and ``others`` (the frozen
    reference model), then on each root, over all ranks of the process group (the launch).
    The architecture is discovered and proven first, on the whole model."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    blocks = architecture_of(model).blocks_path  # the reference model is a copy of it
    for module in (model, *others):
        for block in module.get_submodule(blocks):
            fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh)


def gathered(model: nn.Module) -> AbstractContextManager[None]:
    """Inside: the parameters stay all-gathered after the first forward (no all-gather per
    generated token); resharded on exit. That costs the unsharded model's memory on each
    rank for the rollouts' duration, so on a GPU it is done only when the whole model takes
    at most half the free memory; otherwise generation stays sharded (one all-gather per
    block per token: slower, same tokens). No-op unsharded."""
    device = next(model.parameters()).device
    if is_sharded(model) and device.type == "cuda":
        whole_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        if whole_bytes > torch.cuda.mem_get_info(device)[0] / 2:
            return contextlib.nullcontext()
    return held_unsharded(model, after="forward")


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def _tied(model: nn.Module) -> list[list[str]]:
    """Names of every parameter registered under more than one name (tied weights)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def full_model_state(model: nn.Module, drop_tied: bool = False) -> dict[str, torch.Tensor]:
    """The whole (unsharded) state dict on rank 0's CPU, empty on other ranks; every rank
    must call it (it all-gathers). An unsharded model's own state dict.

    Tied parameters (one parameter under two names, e.g. the embedding and the head) come
    out as one tensor under both names, as from ``state_dict()``, so ``save_pretrained``
    stores them once; ``drop_tied`` keeps only the first name (safetensors' ``save_file``
    refuses tensors that share storage; ``load_full_states`` restores the others)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state = get_model_state_dict(model, options=_options())
    for first, *others in _tied(model):
        for other in others:
            if first in state:
                state[other] = state[first]
                if drop_tied:
                    del state[other]
    return state


def full_states(
    model: nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(model, optimizer) full state dicts of a sharded run on rank 0 (collective). The
    optimizer's is keyed by parameter name (torch.distributed.checkpoint's format)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model_state = full_model_state(model, drop_tied=True)
    return model_state, get_optimizer_state_dict(model, optimizer, options=_options())


def load_full_states(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
) -> None:
    """The inverse of ``full_states`` on every rank (each has read the checkpoint's files):
    each rank keeps its own shards of the full tensors."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    for first, *others in _tied(model):  # stored once (``full_model_state(drop_tied=True)``)
        for other in others:
            model_state.setdefault(other, model_state[first])
    set_model_state_dict(model, model_state, options=options)
    set_optimizer_state_dict(model, optimizer, optimizer_state, options=options)
