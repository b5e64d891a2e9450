"""One hook lifecycle (cdscope.hooks): removal on exit and on errors, no double install,
and the owners that use it (EdgeHooks) leave nothing behind."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cdscope.core.eap import EdgeHooks
from cdscope.hooks import HookSet, first_tensor, replace_first, replace_input
from tests.helpers import tiny_model


def _hooked(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def _doubling(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    return 2 * output


def test_hooks_act_inside_and_are_removed_on_exit() -> None:
    layer, x = nn.Linear(3, 3), torch.randn(2, 3)
    plain = layer(x)
    with HookSet("test") as hooks:
        hooks.forward(layer, _doubling)
        hooks.forward_pre(layer, lambda m, args: (args[0] + 1,))
        assert hooks.installed and _hooked(layer) == 2
        torch.testing.assert_close(layer(x), 2 * layer.forward(x + 1))
    assert not hooks.installed and _hooked(layer) == 0
    torch.testing.assert_close(layer(x), plain)


def test_hooks_are_removed_when_the_block_raises() -> None:
    layer = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="boom"), HookSet("test") as hooks:
        hooks.forward(layer, _doubling)
        raise ValueError("boom")
    assert _hooked(layer) == 0 and not hooks.installed


def test_a_failing_install_removes_what_it_registered() -> None:
    layers = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))

    def register(hooks: HookSet) -> None:
        hooks.forward(layers[0], _doubling)
        hooks.forward_pre(layers[1], lambda m, args: None)
        raise RuntimeError("half-way")

    hooks = HookSet("test")
    with pytest.raises(RuntimeError, match="half-way"):
        hooks.install(register)
    assert _hooked(layers) == 0 and not hooks.installed
    hooks.install(lambda h: h.forward(layers[0], _doubling))  # usable again afterwards
    assert _hooked(layers) == 1
    hooks.remove()
    assert _hooked(layers) == 0


def test_double_install_is_refused_and_keeps_the_first() -> None:
    layer = nn.Linear(3, 3)
    hooks = HookSet("Owner")
    hooks.install(lambda h: h.forward(layer, _doubling))
    with pytest.raises(RuntimeError, match="Owner hooks are already installed"):
        hooks.install(lambda h: h.forward(layer, _doubling))
    with pytest.raises(RuntimeError, match="already installed"), hooks:
        pass
    assert _hooked(layer) == 1  # the refused installs added nothing, the first set stands
    hooks.remove()
    hooks.remove()  # idempotent
    assert _hooked(layer) == 0


def test_adding_outside_an_install_is_refused() -> None:
    with pytest.raises(RuntimeError, match="not being installed"):
        HookSet("test").forward(nn.Linear(2, 2), _doubling)


def test_output_and_input_helpers() -> None:
    a, b = torch.ones(2), torch.zeros(2)
    assert first_tensor(a) is a and first_tensor((a, b)) is a and first_tensor([a]) is a
    assert first_tensor(None) is None and first_tensor(()) is None
    assert replace_first((a, b), b)[0] is b and replace_first((a, b), b)[1] is b
    assert replace_first(a, b) is b
    args, kwargs = replace_input((a, 3), {"k": 1}, b)
    assert args[0] is b and args[1] == 3 and kwargs == {"k": 1}
    args, kwargs = replace_input((), {"hidden_states": a}, b)
    assert args == () and kwargs["hidden_states"] is b


def test_edge_hooks_are_removed_on_error_and_refuse_double_install() -> None:
    model = tiny_model("llama")
    ids = torch.randint(0, 100, (1, 5))
    edge_hooks = EdgeHooks(model)
    with pytest.raises(ValueError, match="inside"), edge_hooks:
        assert _hooked(model) > 0
        model(input_ids=ids)
        raise ValueError("inside")
    assert _hooked(model) == 0
    with edge_hooks, pytest.raises(RuntimeError, match="EdgeHooks hooks are already installed"):
        edge_hooks.__enter__()
    assert _hooked(model) == 0
