"""``cdscope --help``, ``--version`` and every ``COMMAND --help`` start without the heavy stack.

Typer reads every command's signature at start, so the option declarations (and the
defaults they show: ``cdscope.settings``) must import without torch, transformers, pandas,
numpy or pyarrow. Checked here by what is in ``sys.modules`` after the call, in a fresh
interpreter; the time it takes is measured by benchmarks/bench_cli_start.py, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "pandas", "numpy", "pyarrow", "scipy", "matplotlib")
COMMANDS = (
    "probe", "bshared", "acg", "decompose", "random-ref", "nsweep", "eap-info", "gradcheck",
    "eval", "train", "inspect", "models",
)  # fmt: skip

PROBE = """
import contextlib, io, json, runpy, sys
watched = set(json.loads(sys.argv[2]))
sys.argv = ["cdscope", *json.loads(sys.argv[1])]
shown = io.StringIO()
code = None
try:
    with contextlib.redirect_stdout(shown):
        runpy.run_module("cdscope", run_name="__main__")
except SystemExit as exc:
    code = exc.code
heavy = sorted({m.split(".")[0] for m in sys.modules} & watched)
print(json.dumps({"code": code, "heavy": heavy, "shown": shown.getvalue()}))
"""


def startup(args: list[str], cwd: Path) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(args), json.dumps(HEAVY)],
        capture_output=True, text=True, timeout=120, check=True, cwd=cwd,
    )  # fmt: skip
    return json.loads(run.stdout)


@pytest.mark.parametrize("args", [["--help"], ["--version"], *([c, "--help"] for c in COMMANDS)])
def test_help_and_version_import_no_heavy_package(args: list[str], tmp_path: Path) -> None:
    found = startup(args, tmp_path)
    assert found["code"] in (0, None)
    assert found["heavy"] == [], f"cdscope {' '.join(args)} imported {found['heavy']}"
    assert ("Usage:" in found["shown"]) or found["shown"].startswith("cdscope ")


def test_the_probe_sees_a_heavy_import(tmp_path: Path) -> None:
    """The check can fail: a command that runs (not just --help) imports the stack."""
    found = startup(["random-ref", "-M", "3", "-K", "4", "-T", "16", "-o", "r.parquet"], tmp_path)
    assert found["code"] in (0, None) and (tmp_path / "r.parquet").is_file()
    assert {"numpy", "pandas", "pyarrow"} <= set(found["heavy"])
