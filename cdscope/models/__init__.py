"""Model loading and architecture adapters (where the residual writes are)."""

from __future__ import annotations

from cdscope.models.adapters import ADAPTERS, Adapter, adapter_for
from cdscope.models.loading import EMBEDDED_NAME, LoadedModel, load_model

__all__ = ["ADAPTERS", "Adapter", "EMBEDDED_NAME", "LoadedModel", "adapter_for", "load_model"]
