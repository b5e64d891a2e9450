"""Every command's settings, in the ground floor: one dataclass per command whose
defaults, flags, help and bounds are the command's options (``cdscope.cli.options``
builds them), validated once in ``__post_init__``; and the names they share.

* ``names``      -- bounds (SEED_MAX, COUNT_MAX), granularities (SUBLAYER once), estimators,
                    templates, what ``--dtype auto`` means; ``setting`` (a field that is
                    an option)
* ``model``      -- ModelSettings: the model-options group of every model-loading command
* ``measuring``  -- ProbeSettings (probe and the audits), AuditSettings, NsweepSettings,
                    GradcheckSettings, EapSettings, RandomRefSettings
* ``evaluation`` -- EvalSettings (and the --k / --max-new-tokens parsers)
* ``training``   -- TrainConfig (SPEC §5 reference recipe) and its presets

Light on purpose (no torch, no numpy): the CLI declares its options from here, so
``cdscope --help`` starts in a fraction of a second.
"""

from __future__ import annotations

from cdscope.settings.evaluation import (
    DEFAULT_MAX_NEW_TOKENS,
    FALLBACK_MAX_NEW_TOKENS,
    EvalSettings,
    parse_ks,
    parse_max_new_tokens,
)
from cdscope.settings.measuring import (
    NS_SWEPT,
    AuditSettings,
    EapSettings,
    GradcheckSettings,
    NsweepSettings,
    ProbeSettings,
    RandomRefSettings,
)
from cdscope.settings.model import ModelSettings
from cdscope.settings.names import (
    C_ESTIMATORS,
    COUNT_MAX,
    DEFAULT_EPS,
    DEFAULT_ESTIMATOR,
    EDGE,
    GATE_GRANULARITIES,
    GRADIENT_ESTIMATORS,
    GRANULARITIES,
    SEED_MAX,
    SUBLAYER,
    TEMPLATES,
    TRAIN_AUTO_DTYPE,
    option_fields,
    setting,
)
from cdscope.settings.training import PRESETS, TrainConfig

__all__ = [
    "COUNT_MAX",
    "C_ESTIMATORS",
    "DEFAULT_EPS",
    "DEFAULT_ESTIMATOR",
    "DEFAULT_MAX_NEW_TOKENS",
    "EDGE",
    "FALLBACK_MAX_NEW_TOKENS",
    "GATE_GRANULARITIES",
    "GRADIENT_ESTIMATORS",
    "GRANULARITIES",
    "NS_SWEPT",
    "PRESETS",
    "SEED_MAX",
    "SUBLAYER",
    "TEMPLATES",
    "TRAIN_AUTO_DTYPE",
    "AuditSettings",
    "EapSettings",
    "EvalSettings",
    "GradcheckSettings",
    "ModelSettings",
    "NsweepSettings",
    "ProbeSettings",
    "RandomRefSettings",
    "TrainConfig",
    "option_fields",
    "parse_ks",
    "parse_max_new_tokens",
    "setting",
]
