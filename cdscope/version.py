"""The package version, in the ground tier: ``cdscope.io`` stamps it into every output's
metadata, the report page and ``--version`` print it, without importing the package face
(``cdscope/__init__.py``, the top tier) from below. pyproject.toml reads it from here
(``[tool.setuptools.dynamic]``), so this is its one place."""

from __future__ import annotations

__version__ = "0.1.0"
