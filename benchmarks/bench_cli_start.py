"""How long ``cdscope --help`` / ``--version`` / ``COMMAND --help`` take, whole process (issue 28).

Each invocation is a fresh process (``cdscope`` console script of the given environment),
run R times, interleaved so machine load hits all alike; prints the median and the best
wall-clock seconds per invocation, and which heavy packages (torch, transformers, pandas,
numpy, pyarrow, scipy, matplotlib) the help path imported (read from ``-X importtime``).
Target: under 0.5 s (median) for ``--help`` and ``--version``.

    python benchmarks/bench_cli_start.py [--reps 10] [--bin .venv/bin]

``--bin`` names the environment's bin folder (compare a checkout before and after a change:
``--bin /path/to/other/.venv/bin``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("torch", "transformers", "pandas", "numpy", "pyarrow", "scipy", "matplotlib")
CALLS = (
    ("--help",),
    ("--version",),
    ("bshared", "--help"),
    ("train", "--help"),
    ("eval", "--help"),
)


def heavy_imports(python: Path, args: tuple[str, ...]) -> list[str]:
    """Top-level heavy packages imported by ``python -X importtime -m cdscope ARGS``, run
    outside any checkout (``-m`` puts the working directory on sys.path)."""
    run = subprocess.run(
        [str(python), "-X", "importtime", "-m", "cdscope", *args],
        capture_output=True, text=True, timeout=120, check=False, cwd=tempfile.gettempdir(),
    )  # fmt: skip
    names = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in run.stderr.splitlines()}
    return sorted(names & set(HEAVY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--bin", type=Path, default=Path(sys.executable).parent)
    args = parser.parse_args()
    script, python = args.bin / "cdscope", args.bin / "python"
    times: dict[tuple[str, ...], list[float]] = {call: [] for call in CALLS}
    for _ in range(args.reps):
        for call in CALLS:
            start = time.perf_counter()
            subprocess.run(
                [str(script), *call], capture_output=True, timeout=120, check=True,
                cwd=tempfile.gettempdir(),
            )  # fmt: skip
            times[call].append(time.perf_counter() - start)
    print(f"{script}  ({args.reps} runs each; seconds per process)")
    print(f"{'command':<26}{'median':>8}{'best':>8}  heavy imports")
    for call, values in times.items():
        heavy = ", ".join(heavy_imports(python, call)) or "none"
        name = "cdscope " + " ".join(call)
        print(f"{name:<26}{statistics.median(values):8.3f}{min(values):8.3f}  {heavy}")


if __name__ == "__main__":
    main()
