"""bshared overhead over the probe estimation, and the --from rerun time (issue 3).

In one process: the probe estimation alone (``collect_control``, S seeds) and the whole
``bshared`` workflow (estimation + spectral measures + summaries + Parquet), on the
embedded model. Then ``cdscope bshared --from`` as a user runs it (a fresh process,
imports included), median of 3.

    .venv/bin/python benchmarks/bench_bshared.py [--seeds 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=7)
    args = parser.parse_args()

    from rich.console import Console

    from cdscope.commands.audit import AUDITS, sibling
    from cdscope.commands.audit_run import run_audit
    from cdscope.commands.probe import ModelOptions, ProbeSettings, collect_control
    from cdscope.core.models import load_model
    from cdscope.core.probes import load_pool

    quiet = Console(file=open("/dev/null", "w"), stderr=False)  # noqa: SIM115
    load_model()  # cache ready; the timed runs below load it again, as users do
    pool, settings = load_pool(), ProbeSettings(tuple(range(args.seeds)))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "b.parquet"
        start = time.perf_counter()
        collect_control(
            ["smollm2-135m"], pool, settings, Path(tmp) / "p.parquet", ModelOptions(), console=quiet
        )
        t_probe = time.perf_counter() - start
        start = time.perf_counter()
        run_audit(
            AUDITS["bshared"],
            out,
            ["smollm2-135m"],
            None,
            settings,
            None,
            ModelOptions(),
            False,
            quiet,
        )
        t_bshared = time.perf_counter() - start
        reruns = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "cdscope.cli",
                    "bshared",
                    "--from",
                    str(sibling(out, "probe")),
                    "--out",
                    str(Path(tmp) / "again.parquet"),
                ],
                check=True,
                capture_output=True,
            )
            reruns.append(time.perf_counter() - start)
    print(f"embedded model, {args.seeds} seeds, n = 3, CPU")
    print(f"probe estimation alone: {t_probe:.1f} s")
    print(
        f"bshared end to end:     {t_bshared:.1f} s   ratio {t_bshared / t_probe:.3f} (target <= 1.3)"
    )
    print(
        f"bshared --from (fresh process, median of 3): {statistics.median(reruns):.2f} s (target <= 2 s)"
    )


if __name__ == "__main__":
    main()
