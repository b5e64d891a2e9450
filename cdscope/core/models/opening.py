"""The one door to a ``LoadedModel``: ``open_model`` takes a spec (hub id, local directory,
``.gguf``, the embedded default; ``loading.load_model``), a transformers model and its
tokenizer loaded by the caller (``wrap``: checked, placed, proven), or a ``LoadedModel`` (as
it is). The Python API, every command (``ModelOptions.load``) and ``train`` open models here.

``ModelOptions`` is how to load each model: the model-options group every loading command
takes (``cdscope.settings.ModelSettings``, the placement parsed). Light on purpose (no torch
at import): readers of probe files and ``--resume`` compare these options without the model
stack.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdscope.errors import CdscopeError
from cdscope.settings import ModelSettings

if TYPE_CHECKING:  # the model stack loads only when a model is opened
    from cdscope.core.models.loading import LoadedModel
    from cdscope.core.models.placement import Placement


@dataclass(frozen=True)
class ModelOptions:
    """How to load each model (``cdscope.core.models.load_model``'s keyword arguments): one
    device, or spread by a ``Placement`` (device map). Defaults: ``ModelSettings``'."""

    device: str = ModelSettings.device
    dtype: str = ModelSettings.dtype
    attn: str = ModelSettings.attn
    placement: Placement | None = None
    revision: str | None = None  # hub branch / tag / commit (hub ids only)
    trust_remote_code: bool = False  # run the model repository's own code (hub/local dirs)

    @classmethod
    def from_settings(cls, settings: ModelSettings) -> ModelOptions:
        """The options as typed (``ModelSettings``), the placement parsed and checked
        before any load."""
        placement = None
        if settings.places:
            from cdscope.core.models.placement import Placement

            placement = Placement.from_options(
                settings.device_map, settings.max_memory, settings.offload_dir
            )
        return cls(
            settings.device, settings.dtype, settings.attn, placement,
            revision=settings.revision, trust_remote_code=settings.trust_remote_code,
        )  # fmt: skip

    def load_kwargs(self) -> dict:
        return {
            "device": self.device,
            "dtype": self.dtype,
            "attn": self.attn,
            "placement": self.placement,
            "revision": self.revision,
            "trust_remote_code": self.trust_remote_code,
        }

    def load(self, spec: str, console: object | None = None) -> LoadedModel:
        return open_model(spec, options=self, console=console)


def open_model(
    model: Any,
    tokenizer: Any = None,
    *,
    options: ModelOptions | None = None,
    name: str | None = None,
    console: object | None = None,
) -> LoadedModel:
    """``model`` ready to measure or train: a spec (str or path) loaded with ``options``,
    a transformers model with its ``tokenizer`` wrapped (``options``' device and dtype;
    ``auto`` keeps the model's), or a ``LoadedModel`` as it is. ``name`` labels the rows."""
    from torch import nn

    from cdscope.core.models.loading import LoadedModel, load_model

    options = options or ModelOptions()
    if isinstance(model, LoadedModel):
        if tokenizer is not None:
            raise CdscopeError("this model is already loaded with its tokenizer; drop tokenizer=")
        return model
    if isinstance(model, str | Path):
        if tokenizer is not None:
            raise CdscopeError(
                "tokenizer= goes with a model object; a model id or path loads its own tokenizer"
            )
        loaded = load_model(str(model), console=console, **options.load_kwargs())
    elif isinstance(model, nn.Module):
        loaded = wrap(model, tokenizer, options.device, options.dtype)
    else:
        raise CdscopeError(
            "model must be a hub id, a local directory, a .gguf path or a transformers model, "
            f"not {type(model).__name__}"
        )
    if name is not None:
        loaded.name = name
    return loaded


@contextlib.contextmanager
def library_bars_off() -> Iterator[None]:
    """transformers' and the hub's progress bars ("Loading weights", downloads) off inside
    the block and restored after it: the Python API loads as quietly as the CLI, which
    turns them off for the whole process (``--verbose`` lets them through)."""
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    bars_on, hub_off = hf_logging.is_progress_bar_enabled(), hub.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # the hub's bars too
    try:
        yield
    finally:
        if bars_on:
            hf_logging.enable_progress_bar()  # the hub's bars too, so:
        if hub_off:
            hub.disable_progress_bars()


def wrap(model: Any, tokenizer: Any, device: str = "auto", dtype: str = "auto") -> LoadedModel:
    """Wrap a transformers model + tokenizer loaded by the caller, after checking both."""
    from cdscope.core.models.architecture import architecture_of
    from cdscope.core.models.loading import (
        LoadedModel,
        fit_experts,
        resolve_device,
        resolve_dtype,
    )

    if tokenizer is None:
        raise CdscopeError(
            "a model object needs its tokenizer: cdscope.load_model(model, tokenizer)"
        )
    if not callable(tokenizer) or not hasattr(tokenizer, "__len__"):
        raise CdscopeError(
            f"tokenizer must be a transformers tokenizer, not {type(tokenizer).__name__}"
        )
    embedding = model.get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    if rows is not None and len(tokenizer) > rows:
        raise CdscopeError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has {rows} "
            "rows, so they do not belong together; pass the tokenizer saved with this model"
        )
    parameter = next(model.parameters())
    if device != "auto":
        model.to(resolve_device(device))
    if dtype != "auto":
        model.to(resolve_dtype(dtype, parameter.device))
    model.eval()
    parameter = next(model.parameters())
    fit_experts(model, parameter.dtype, parameter.device)  # float64 experts run eager
    architecture_of(model)  # proven in the dtype it will run in; unsupported ones refused
    config = model.config
    source = getattr(config, "_name_or_path", "") or "in-memory"
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=source if source != "in-memory" else type(model).__name__,
        source=source,
        revision=getattr(config, "_commit_hash", None) or "in-memory",
        device=parameter.device,
        dtype=parameter.dtype,
    )
