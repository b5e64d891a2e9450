"""cdscope: gated sublayer control diagnostics for RL post-training of language models.

The public Python API (docs/api.md; SPEC sections cited there)::

    import cdscope
    model = cdscope.load_model("smollm2-135m")   # id, directory, .gguf, or (model, tokenizer)
    frame = cdscope.measure(model, seeds=3)      # C, F, l_m per (model, seed, family, gate)
    result = cdscope.bshared(frame)              # .per_seed / .summary / .paired DataFrames

The names below are imported on first use, so ``import cdscope`` (and the CLI's start)
stays light; ``from cdscope import *`` and type checkers see them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdscope.lazy import lazy_exports
from cdscope.version import __version__

if TYPE_CHECKING:
    from cdscope.api import (
        acg,
        bshared,
        compare,
        decompose,
        draw_probe,
        load_model,
        load_pool,
        measure,
        plot,
        random_reference,
        read_results,
    )
    from cdscope.commands.audit import AuditResult
    from cdscope.commands.random_ref import RandomReferenceResult
    from cdscope.core.models.loading import LoadedModel
    from cdscope.core.probes import ProbePool
    from cdscope.errors import CdscopeError

_EXPORTS = {
    "acg": "cdscope.api",
    "bshared": "cdscope.api",
    "compare": "cdscope.api",
    "decompose": "cdscope.api",
    "draw_probe": "cdscope.api",
    "load_model": "cdscope.api",
    "load_pool": "cdscope.api",
    "measure": "cdscope.api",
    "plot": "cdscope.api",
    "random_reference": "cdscope.api",
    "read_results": "cdscope.api",
    "AuditResult": "cdscope.commands.audit",
    "RandomReferenceResult": "cdscope.commands.random_ref",
    "CdscopeError": "cdscope.errors",
    "LoadedModel": "cdscope.core.models.loading",
    "ProbePool": "cdscope.core.probes",
}

__all__ = [
    "AuditResult",
    "CdscopeError",
    "LoadedModel",
    "ProbePool",
    "RandomReferenceResult",
    "__version__",
    "acg",
    "bshared",
    "compare",
    "decompose",
    "draw_probe",
    "load_model",
    "load_pool",
    "measure",
    "plot",
    "random_reference",
    "read_results",
]


__getattr__ = lazy_exports(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
