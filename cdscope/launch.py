"""``python -m cdscope.launch``: torchrun, with one line per failed rank instead of its trace.

This is torchrun itself — ``torch.distributed.run``'s own argument parser and ``run``, so
every torchrun option, rendezvous and restart policy is there, and nothing is scheduled
here. The only difference is how a failed run ends: torchrun raises ``ChildFailedError``
and Python prints a traceback plus a failure table (about 40 lines after cdscope's one
line). Here the ranks' own lines stand alone (rank 0 names a failure that reached every
rank: ``error: rank 1: ...``), a rank that could not say anything (killed by a signal,
or silent because rank 0 died first) gets one line, and the exit code is the ranks' (2
for bad input, 1 for a failed audit threshold) rather than torchrun's 1. torchrun's
logger is quiet unless ``LOGLEVEL`` says otherwise. docs/distributed.md shows it::

    python -m cdscope.launch --standalone --nproc_per_node 8 -m cdscope.cli -- bshared ...
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence

from cdscope.messages import make_console, say


def failure_lines(failures: Mapping[int, object]) -> tuple[list[str], int]:
    """The lines to print for torchrun's ``ChildFailedError.failures`` (rank -> failure
    with ``exitcode``, ``pid``, ``signal_name()``) and the exit code of the launch.

    Rank 0 prints cdscope's one line itself whenever it exits with a code, and that line
    covers the other ranks' (a failure is shared by every rank before they exit), also a
    rank the launcher stopped (SIGTERM) after rank 0 exited, on its way out with the same
    failure (a race: seen under load); a rank killed by another signal, or by SIGTERM when
    rank 0 had no say, and any rank when rank 0 had no say, gets a line here."""
    lines = []
    lead = failures.get(0)
    lead_spoke = lead is not None and getattr(lead, "exitcode", -1) > 0
    for rank in sorted(failures):
        failure = failures[rank]
        code, pid = getattr(failure, "exitcode", -1), getattr(failure, "pid", "?")
        if code < 0:
            name = failure.signal_name() if hasattr(failure, "signal_name") else f"signal {-code}"
            if lead_spoke and name == "SIGTERM":
                continue
            how = "stopped by the launcher (SIGTERM)" if name == "SIGTERM" else f"killed by {name}"
            lines.append(
                f"rank {rank} (pid {pid}) was {how}; finished work is kept: rerun with --resume"
            )
        elif not lead_spoke:
            lines.append(f"rank {rank} (pid {pid}) exited with code {code}")
    codes = [getattr(f, "exitcode", -1) for f in failures.values()]
    exit_code = lead.exitcode if lead_spoke else max([c for c in codes if c > 0], default=1)  # type: ignore[union-attr]
    return lines, exit_code


def main(argv: Sequence[str] | None = None) -> None:
    """Run torchrun with ``argv`` (default: this process's arguments)."""
    level = os.environ.setdefault("LOGLEVEL", "CRITICAL")  # torchrun's logs: its own levels
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    logging.getLogger("torch.distributed.elastic").setLevel(level)  # plain getLogger children

    args = get_args_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        run(args)
    except ChildFailedError as exc:
        lines, code = failure_lines(exc.failures)
        console = make_console()
        for line in lines:
            say(console, ("error:", "bold red"), " ", line)
        raise SystemExit(code) from None


if __name__ == "__main__":
    main()
