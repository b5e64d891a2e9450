"""Names a package exports but imports only on first use (PEP 562), so importing the
package stays light: ``cdscope`` (the CLI's start, ``--help``) and ``cdscope.core.models``
(its light ``ModelOptions`` without torch)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: name ``n`` of ``exports`` is
    ``exports[n]``'s attribute ``n``, imported when first asked for and then bound."""

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's name
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
