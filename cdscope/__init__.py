"""cdscope: gated sublayer control diagnostics for RL post-training of language models.

See ``../shared/SPEC.md`` (mirrored in ``docs/``) for the quantities computed here.
"""

from __future__ import annotations

__version__ = "0.1.0"
