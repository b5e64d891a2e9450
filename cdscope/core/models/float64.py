"""Float64 throughout: the exact reference the precision checks compare against (issue 24).

A transformers model loaded in float64 is not float64 everywhere: Llama-style RMSNorms
compute ``hidden_states.to(torch.float32)``, rotary tables are built with ``.float()``
under a disabled autocast, routers and some mixers upcast to float32 on purpose. Those
steps round to float32 (unit roundoff 6e-8) inside an otherwise float64 forward, which
puts a floor of about 1e-7 relative under every float64 measurement, and finite
differences divide it by the step: a fourth-order central difference at h = 1e-4 then
carries ~1e-3 of rounding noise, the size of a real disagreement (measured: tiny Llama,
Qwen3-MoE, Aria; docs/precision.md).

``float64_throughout()`` removes that floor for as long as it is active:

- a ``TorchDispatchMode`` rewrites every operator call that asks for a float32, float16 or
  bfloat16 result (``.float()``, ``.to(torch.float32)``, ``type_as``, factories with
  ``dtype=``) to ask for float64 instead;
- the default dtype is float64, so factories without ``dtype=`` (``torch.arange(0.0, n)``)
  make float64 too.

It sits below autograd (gradients of the rewritten casts are float64 like their inputs)
and changes no tensor that exists already, so the model must be in float64 (its
parameters and buffers) for the whole forward to be. What stays: integer and complex
arithmetic, and in-place writes into a float32 tensor made before the context. Used by
the architecture coverage (autograd C against finite differences) and by the precision
study (``benchmarks/precision.py``) as the reference every dtype is compared with; a
Python callback per operator makes it several times slower than a plain forward, so no
measuring command turns it on.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: result dtypes rewritten to float64
NARROW = (torch.float32, torch.float16, torch.bfloat16)


class WidenToFloat64(TorchDispatchMode):
    """Operator calls asking for a narrow floating dtype get float64 instead."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if kwargs.get("dtype") in NARROW:
            kwargs = {**kwargs, "dtype": torch.float64}
        return func(*args, **kwargs)


@contextmanager
def float64_throughout() -> Iterator[None]:
    """Inside the block, a float64 model computes every floating step in float64."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with WidenToFloat64():
            yield
    finally:
        torch.set_default_dtype(previous)
