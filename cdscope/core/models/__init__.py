"""Model loading and the architecture description (where the residual writes are)."""

from __future__ import annotations

from cdscope.core.models.architecture import Architecture, Write, architecture_of
from cdscope.core.models.loading import EMBEDDED_NAME, LoadedModel, load_model

__all__ = ["EMBEDDED_NAME", "Architecture", "LoadedModel", "Write", "architecture_of", "load_model"]
