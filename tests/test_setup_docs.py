"""What a set-up installs outside this workplace (issue #40, item 8): the README says which
PyTorch a CPU-only machine and a GPU machine get, and the Makefile does what it says --
``TORCH_INDEX`` sends the pinned torch to another wheel index, unset it changes nothing."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def torch_pin() -> str:
    """The Makefile's torch pin (``TORCH := torch==X``)."""
    found = re.search(r"^TORCH := (torch==\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, "the Makefile lost its TORCH pin"
    return found.group(1)


def dry_run(*variables: str) -> list[str]:
    """The torch install line ``make setup`` would run (``-n``: nothing runs)."""
    run = subprocess.run(["make", "-n", "-B", "setup", *variables], cwd=ROOT, text=True,
                         capture_output=True, check=True)  # fmt: skip
    return [line for line in run.stdout.splitlines() if "pip install -q torch" in line]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_torch_index_sends_the_pinned_torch_to_another_index_and_unset_changes_nothing():
    pin = torch_pin()
    (line,) = dry_run()
    assert f"pip install -q {pin} " in line and "--index-url" not in line  # as before here
    (line,) = dry_run(f"TORCH_INDEX={CPU_INDEX}")
    assert f"pip install -q {pin} --index-url {CPU_INDEX} " in line


def test_the_readme_says_what_each_machine_installs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert f"`{torch_pin()}`" in readme  # the pin the Makefile holds, not another
    assert f"make demo TORCH_INDEX={CPU_INDEX}" in readme  # a CPU-only machine
    assert "GPU machine: the CUDA build from PyPI" in readme
    assert "NVIDIA" in readme and "CPU-only" in readme
