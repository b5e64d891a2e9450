"""Model loading and the architecture description (where the residual writes are).

The door to a model is ``open_model`` (``opening.py``): a spec, a transformers model with its
tokenizer, or a ``LoadedModel``; ``ModelOptions`` says how to load. Names load lazily, so the
light ``ModelOptions`` does not import torch.
"""

from __future__ import annotations

from cdscope.lazy import lazy_exports

_EXPORTS = {
    "Architecture": "cdscope.core.models.architecture",
    "Write": "cdscope.core.models.architecture",
    "architecture_of": "cdscope.core.models.architecture",
    "EMBEDDED_NAME": "cdscope.core.models.loading",
    "LoadedModel": "cdscope.core.models.loading",
    "load_model": "cdscope.core.models.loading",
    "ModelOptions": "cdscope.core.models.opening",
    "open_model": "cdscope.core.models.opening",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
