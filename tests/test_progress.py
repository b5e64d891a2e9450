"""Progress in logs: where stderr is not a terminal, one line per finished unit.

``messages.progress_bar`` is the one place progress is made. On a terminal it is rich's live
bar; on a file, a pipe, SLURM or CI (where rich would draw the bar once, at the end) it
prints a line per advance with done/total, the elapsed time and the time left.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdscope import messages
from cdscope.messages import LineProgress, clock, make_console, progress_bar


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    ticking = Clock()
    monkeypatch.setattr(messages.time, "monotonic", ticking)
    return ticking


def log_console(quiet: bool = False):  # noqa: ANN201 - a rich Console writing to a buffer
    console = make_console(quiet=quiet)
    console.file = io.StringIO()
    return console


def test_a_log_gets_one_line_per_unit_with_elapsed_and_time_left(fake_clock: Clock) -> None:
    console = log_console()
    with progress_bar(console) as progress:
        assert isinstance(progress, LineProgress) and progress.lines
        task = progress.add_task("probing", total=4, completed=1)  # one unit resumed
        progress.update(task, description="m seed 1")  # a new description alone: no line
        fake_clock.now += 10
        progress.advance(task)
        fake_clock.now += 50
        progress.update(task, advance=1, description="m seed 2")
        fake_clock.now += 30
        progress.advance(task)
    lines = console.file.getvalue().splitlines()
    # rate from the units done since add_task: 10 s for 1 -> 2 left = 20 s; 60 s for 2 ->
    # 1 left = 30 s; the last one finishes the task
    assert lines == [
        "m seed 1: 2/4 done, 0:00:10 elapsed, about 0:00:20 left",
        "m seed 2: 3/4 done, 0:01:00 elapsed, about 0:00:30 left",
        "m seed 2: 4/4 done, 0:01:30 elapsed, finished",
    ]


def test_extra_fields_and_unknown_totals_are_shown(fake_clock: Clock) -> None:
    console = log_console()
    with progress_bar(console, "live") as progress:
        bar = progress.add_task("train cdrft", total=None, live="")
        fake_clock.now += 3725
        progress.update(bar, advance=1, live="reward 0.50  B_shared 80.1->79.0%")
    assert console.file.getvalue().splitlines() == [
        "train cdrft: 1 done, 1:02:05 elapsed  reward 0.50  B_shared 80.1->79.0%"
    ]


def test_descriptions_with_brackets_stay_verbatim_and_quiet_prints_nothing() -> None:
    console = log_console()
    with progress_bar(console) as progress:
        progress.advance(progress.add_task("runs/lr[2e-6] [bold]x[/bold]", total=1))
    assert console.file.getvalue().startswith("runs/lr[2e-6] [bold]x[/bold]: 1/1 done")
    quiet = log_console(quiet=True)
    with progress_bar(quiet) as progress:
        progress.advance(progress.add_task("x", total=2))
    assert quiet.file.getvalue() == ""


def test_a_terminal_keeps_the_live_bar_and_prints_no_lines() -> None:
    console = make_console()
    console.file = io.StringIO()
    console._force_terminal = True  # what a real tty gives
    assert console.is_terminal
    with progress_bar(console) as progress:
        assert not progress.lines
        task = progress.add_task("probing", total=2)
        progress.advance(task)
        progress.advance(task)
    shown = console.file.getvalue()
    assert "done," not in shown and "━" in shown and "2/2" in shown  # rich's bar


def test_clock_formats_like_rich() -> None:
    assert [clock(s) for s in (0, 59.4, 61, 3600, 36000 + 61)] == [
        "0:00:00", "0:00:59", "0:01:01", "1:00:00", "10:01:01",
    ]  # fmt: skip


def test_a_probe_run_piped_to_a_file_logs_a_line_per_seed(
    tiny_model_dir: Path, pool_file: Path, tmp_path: Path
) -> None:
    """The user's case: ``cdscope probe ... 2> log`` (not a terminal), three seeds."""
    log = tmp_path / "log.txt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(log, "w") as handle:
        subprocess.run(
            [sys.executable, "-m", "cdscope", "probe", "-m", str(tiny_model_dir), "-p",
             str(pool_file), "--seeds", "3", "--n", "2", "-o", str(tmp_path / "p.parquet")],
            stdout=subprocess.DEVNULL, stderr=handle, env=env, timeout=300, check=True,
        )  # fmt: skip
    lines = [line for line in log.read_text().splitlines() if " done, " in line]
    assert [line.split(": ")[0] for line in lines] == [
        f"{tiny_model_dir} seed {seed}" for seed in range(3)
    ]
    assert [line.split(": ")[1].split(" done")[0] for line in lines] == ["1/3", "2/3", "3/3"]
    assert lines[-1].endswith("finished") and "left" in lines[0]


def test_a_phase_is_a_line_in_a_log_and_a_description_on_a_terminal(fake_clock: Clock) -> None:
    """``phase``: what starts now within a unit (issue #40: no silent minutes in a log)."""
    console = log_console()
    with progress_bar(console) as progress:
        task = progress.add_task("probing", total=1)
        fake_clock.now += 75
        progress.phase(task, "m: finding and proving its residual writes")
        assert progress.tasks[0].description == "m: finding and proving its residual writes"
    assert console.file.getvalue().splitlines() == [
        "m: finding and proving its residual writes ... (0:01:15 elapsed)"
    ]
    terminal = make_console()
    terminal.file = io.StringIO()
    terminal._force_terminal = True
    quiet = log_console(quiet=True)
    for other in (terminal, quiet):
        with progress_bar(other) as progress:
            progress.phase(progress.add_task("probing", total=1), "loading m")
        assert "loading m ..." not in other.file.getvalue()
