"""Architecture adapters: where each layer writes into the residual stream (SPEC §1).

An adapter names, for layer ``l``, the module whose forward *output* is exactly the
tensor added to the residual stream by the attention sublayer and by the MLP sublayer:

    h_{l+1} = h_l + attn_write_l + mlp_write_l

cdscope multiplies that output by a gate (see ``cdscope.gates``). Most architectures
add the raw output of ``self_attn`` / ``mlp``; Gemma-2/3 normalise a sublayer's output
before adding it, so there the write is the output of the post-sublayer norm; GPT-NeoX
with parallel residual adds both writes of a layer to the same ``h_l`` — each still has
its own gate. Adding an architecture means adding one ``Adapter`` to ``ADAPTERS``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from cdscope.errors import CdscopeError

SUBLAYERS = ("attn", "mlp")


@dataclass(frozen=True)
class Adapter:
    """How to find the residual writes of one architecture family.

    ``layers`` returns the decoder blocks in order; ``attn_write`` / ``mlp_write`` return,
    for one block, the module whose output (a tensor, or a tuple whose first element is
    the tensor) is the write added to the residual stream.
    """

    name: str
    layers: Callable[[nn.Module], nn.ModuleList]
    attn_write: Callable[[nn.Module], nn.Module]
    mlp_write: Callable[[nn.Module], nn.Module]
    note: str = ""

    def write_modules(self, model: nn.Module) -> list[tuple[int, str, nn.Module]]:
        """``(layer, sublayer, module)`` for every residual write, attention before MLP."""
        sites: list[tuple[int, str, nn.Module]] = []
        for index, block in enumerate(self.layers(model)):
            sites.append((index, "attn", self.attn_write(block)))
            sites.append((index, "mlp", self.mlp_write(block)))
        return sites


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    return model.model.layers


_LLAMA_LIKE = Adapter(
    name="llama",
    layers=_decoder_layers,
    attn_write=lambda block: block.self_attn,
    mlp_write=lambda block: block.mlp,
    note="pre-norm; writes are the raw self_attn / mlp outputs",
)

_GEMMA = Adapter(
    name="gemma2",
    layers=_decoder_layers,
    attn_write=lambda block: block.post_attention_layernorm,
    mlp_write=lambda block: block.post_feedforward_layernorm,
    note="post-sublayer norms: the gate goes on the normed write",
)

_GPT2 = Adapter(
    name="gpt2",
    layers=lambda model: model.transformer.h,
    attn_write=lambda block: block.attn,
    mlp_write=lambda block: block.mlp,
    note="writes are attn (after c_proj + resid dropout) and mlp outputs",
)

_GPT_NEOX = Adapter(
    name="gpt_neox",
    layers=lambda model: model.gpt_neox.layers,
    attn_write=lambda block: block.attention,
    mlp_write=lambda block: block.mlp,
    note="parallel residual (Pythia): both writes of a layer read the same h_l, each gated",
)

#: ``config.model_type`` -> adapter.
ADAPTERS: dict[str, Adapter] = {
    "llama": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "gemma2": _GEMMA,
    "gemma3_text": _GEMMA,
    "gpt2": _GPT2,
    "gpt_neox": _GPT_NEOX,
}


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter for ``model`` (by ``config.model_type``), or a CdscopeError listing the supported ones."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ADAPTERS:
        supported = ", ".join(sorted(ADAPTERS))
        raise CdscopeError(
            f"unsupported architecture {model_type!r}: cdscope knows {supported} "
            "(add an Adapter in cdscope/models/adapters.py)"
        )
    return ADAPTERS[model_type]


def position_limit(model: nn.Module) -> int | None:
    """The longest sequence ``model`` can embed, where that is a hard limit: models with
    learned absolute positions (GPT-2's ``n_positions``) fail on longer inputs; rotary
    models (every other supported architecture) have none."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) == "gpt2":
        return int(config.n_positions)
    return None


def check_fits(model: nn.Module, length: int, what: str, fix: str) -> None:
    """One line when ``length`` tokens of ``what`` exceed the model's positions."""
    limit = position_limit(model)
    if limit is not None and length > limit:
        raise CdscopeError(
            f"{what} is {length} tokens but the model has only {limit} positions; {fix}"
        )
