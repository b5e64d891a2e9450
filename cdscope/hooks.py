"""One lifecycle for the PyTorch hooks cdscope installs (gates, EAP, edge control).

A ``HookSet`` owns the handles of the hooks one object installs on a model:

- ``install(register)`` runs ``register(hooks)``, which adds hooks through ``forward``,
  ``forward_pre`` or ``add`` (a handle registered elsewhere); if ``register`` raises, the
  hooks it added so far are removed before the error propagates;
- installing a set that is already installed raises ``RuntimeError`` (two copies of the
  same hooks would apply a gate twice);
- ``remove()`` removes every hook, and leaving ``with hooks:`` calls it, exceptions
  included; afterwards the set can be installed again.

Used directly (``with HookSet("probe") as hooks: hooks.forward(module, fn)``) or owned
by a context object that installs in ``__enter__`` and removes in ``__exit__``::

    def __enter__(self):
        self._hooks.install(self._register)   # self._hooks = HookSet("GatedModel")
        return self

    def __exit__(self, *exc):
        self._hooks.remove()

The shared helpers for hook bodies live here too: ``first_tensor`` (a module output's
hidden states), ``replace_first`` (the same output with its hidden states replaced) and
``replace_input`` (a call's arguments with its hidden-state input replaced).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle


def first_tensor(value: object) -> torch.Tensor | None:
    """The tensor of a module output: itself, a tuple's / list's first element, or None."""
    if isinstance(value, (tuple, list)) and value:
        value = value[0]
    return value if isinstance(value, torch.Tensor) else None


def replace_first(output: object, tensor: torch.Tensor) -> object:
    """``output`` with its hidden states (itself, or a tuple's first element) replaced."""
    return (tensor, *output[1:]) if isinstance(output, tuple) else tensor  # type: ignore[index]


def replace_input(args: tuple, kwargs: dict, x: torch.Tensor) -> tuple[tuple, dict]:
    """A forward pre-hook's ``(args, kwargs)`` with the hidden-state input replaced by ``x``
    (the first positional argument when it is a tensor, else ``hidden_states``)."""
    if args and isinstance(args[0], torch.Tensor):
        return (x, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": x}


class HookSet:
    """The handles of one owner's hooks, installed together and always removed together."""

    def __init__(self, owner: str) -> None:
        self.owner = owner  # named in the double-install error
        self._handles: list[RemovableHandle] = []
        self._open = False

    @property
    def installed(self) -> bool:
        return self._open

    def install(self, register: Callable[[HookSet], object]) -> HookSet:
        """Run ``register(self)`` to add the hooks; on any error remove them and re-raise."""
        self._begin()
        try:
            register(self)
        except BaseException:
            self.remove()
            raise
        return self

    def add(self, handle: RemovableHandle) -> RemovableHandle:
        """Adopt a handle of a hook registered directly on a module."""
        if not self._open:
            raise RuntimeError(f"{self.owner} hooks are not being installed")
        self._handles.append(handle)
        return handle

    def forward(
        self, module: nn.Module, hook: Callable, *, with_kwargs: bool = False
    ) -> RemovableHandle:
        """``module.register_forward_hook(hook)``, removed with the set."""
        return self.add(module.register_forward_hook(hook, with_kwargs=with_kwargs))

    def forward_pre(
        self, module: nn.Module, hook: Callable, *, with_kwargs: bool = False
    ) -> RemovableHandle:
        """``module.register_forward_pre_hook(hook)``, removed with the set."""
        return self.add(module.register_forward_pre_hook(hook, with_kwargs=with_kwargs))

    def remove(self) -> None:
        """Remove every hook of the set (a no-op when none is installed)."""
        handles, self._handles, self._open = self._handles, [], False
        for handle in handles:
            handle.remove()

    def _begin(self) -> None:
        if self._open:
            raise RuntimeError(f"{self.owner} hooks are already installed")
        self._open = True

    def __enter__(self) -> HookSet:
        self._begin()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()
