"""Discovery of a half-precision model on float32 copies of its blocks, one at a time (issue 24).

In bfloat16 (8 bits of mantissa) a block's update ``h_out - h_in`` is known only to about
``2^-8`` of the largest value each element takes part in; on the embedded model the
attention writes of layers 0-9 fit inside that rounding, so a search in the model's own
dtype takes the MLP alone as the block's update and the proof then fails. The writes are
a property of the block's code, not of its precision, so for ``float16`` and ``bfloat16``
models discovery runs as follows:

1. one forward of the model in its own dtype records each block's call (input, keyword
   arguments such as rotary tables and masks) and the modules outside the blocks;
2. for each block in turn, a ``deepcopy`` of that block alone is cast to float32 and run on
   the same call cast to float32, with every module up to ``MAX_DEPTH`` below it recorded
   under the model's own names; the copy is dropped before the next block's is made.

The search (``discovery.solve_block``) then sees float32 arithmetic, and the proof runs on
the model itself, in its own dtype (``cdscope.core.models.proof``). Extra memory: one
block in float32 (a 70B model's block is about 3.4 GB), never the whole model. Blocks whose
weights sit on another device or on disk under an accelerate device map are gathered for
the copy with ``accelerate.utils.align_module_device``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch
from torch import nn

from cdscope.core.models import discovery as d

#: model dtypes whose writes are searched on float32 block copies
WIDENED = (torch.float16, torch.bfloat16)


def search_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the write search runs in for a model in ``dtype``."""
    return torch.float32 if dtype in WIDENED else dtype


def _cast(value: object, device: torch.device) -> object:
    """Floating tensors in ``value`` (tuples / lists / dicts walked) as float32 on ``device``."""
    if isinstance(value, torch.Tensor):
        dtype = torch.float32 if value.is_floating_point() else value.dtype
        return value.detach().to(device=device, dtype=dtype)
    if type(value) in (tuple, list):
        return type(value)(_cast(v, device) for v in value)
    if type(value) is dict:
        return {k: _cast(v, device) for k, v in value.items()}
    return value


def _clone(value: object) -> object:
    """A snapshot of a block's call: tensors cloned (a block may write into its input)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if type(value) in (tuple, list):
        return type(value)(_clone(v) for v in value)
    if type(value) is dict:
        return {k: _clone(v) for k, v in value.items()}
    return value


@contextmanager
def _resident(block: nn.Module) -> Iterator[None]:
    """The block's weights in place for a copy (offloaded / dispatched ones gathered)."""
    hooked = any(hasattr(m, "_hf_hook") for m in block.modules())
    if not hooked:
        with nullcontext():
            yield
        return
    from accelerate.utils import align_module_device

    with align_module_device(block):
        yield


def float32_copy(block: nn.Module) -> nn.Module:
    """A float32 copy of ``block`` with no accelerate hooks (the weights themselves)."""
    with _resident(block):
        twin = copy.deepcopy(block)
    if any(hasattr(m, "_hf_hook") for m in twin.modules()):
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(twin, recurse=True)
    return twin.float()


def _device_of(module: nn.Module, fallback: torch.device) -> torch.device:
    for p in module.parameters():
        if p.device.type != "meta":
            return p.device
    return fallback


def trace_widened(
    model: nn.Module, blocks: nn.ModuleList, ids: torch.Tensor
) -> tuple[d.Trace, list[d.BlockTrace]]:
    """The model's own trace in its dtype (logits, block inputs / outputs, the modules
    outside the blocks) and, per block, the ``BlockTrace`` of its float32 copy (see the
    module docstring), which the write search reads."""
    calls: list = [None] * len(blocks)
    counts = [0] * len(blocks)

    def capture(hooks: list) -> None:
        for index, block in enumerate(blocks):

            def pre(module: nn.Module, args: tuple, kwargs: dict, index: int = index) -> None:
                calls[index] = (_clone(args), _clone(kwargs))
                counts[index] += 1

            hooks.append(block.register_forward_pre_hook(pre, with_kwargs=True))

    trace = d.trace_forward(model, blocks, ids, depth=0, extra=capture)
    prefix = next(n for n, m in model.named_modules() if m is blocks)
    counter = [0]
    widened = []
    for index, block in enumerate(blocks):
        args, kwargs = calls[index]
        twin = float32_copy(block)
        device = _device_of(twin, ids.device)
        twin.to(device)
        bt = d.BlockTrace()
        hooks: list = [twin.register_forward_hook(d.block_io_hook(bt), with_kwargs=True)]
        try:
            d.record_modules(twin, f"{prefix}.{index}", d.MAX_DEPTH, bt, counter, hooks)
            with torch.no_grad():
                twin(*_cast(args, device), **_cast(kwargs, device))
        finally:
            for handle in hooks:
                handle.remove()
        del twin
        for record in bt.records.values():  # a block run twice per forward (weights shared
            record.calls *= counts[index]  # across passes) is refused as in its own dtype
        widened.append(bt)
    d.check_residual_shapes(widened)
    return trace, widened
