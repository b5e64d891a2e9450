"""Where the shipped probe pools and task sets live: package data inside ``cdscope/data``.

They travel in the wheel (``pip install cdscope`` works from any directory) and are
found with ``importlib.resources``; an environment variable overrides each folder
(``$CDSCOPE_PROBES``, ``$CDSCOPE_TASKS``). The builders that write them
(``probes/build_pools.py``, ``tasks/build_tasks.py``) live outside the package.
"""

from __future__ import annotations

import os
from importlib.resources import files
from pathlib import Path

#: the model every command uses without --model: SmolLM2-135M-Instruct, shipped as a GGUF
#: (``cdscope.core.models.loading``); here so the CLI can name it without importing torch
EMBEDDED_NAME = "smollm2-135m"


def shipped_data_dir(name: str, env: str) -> Path:
    """``$env`` if set, else ``cdscope/data/<name>`` of the installed package."""
    override = os.environ.get(env)
    if override:
        return Path(override)
    # a regular (unzipped) install: the Traversable is a real directory
    return Path(str(files("cdscope") / "data" / name))


def default_task_dir() -> Path:
    """The shipped task sets: ``$CDSCOPE_TASKS`` or the package's ``data/tasks/`` folder."""
    return shipped_data_dir("tasks", "CDSCOPE_TASKS")


def default_probe_dir() -> Path:
    """The shipped probe pools: ``$CDSCOPE_PROBES`` or the package's ``data/probes/``."""
    return shipped_data_dir("probes", "CDSCOPE_PROBES")
