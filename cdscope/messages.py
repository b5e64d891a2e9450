"""The one place cdscope's text reaches the terminal: verbatim, never parsed as markup.

Rich reads ``[...]`` in plain strings as markup (``[bold]``, ``[/]``, ``[link=x]``) and
``:name:`` as emoji codes, so a path like ``runs/lr[2e-6]`` or a hint like
``pip install 'cdscope[trl]'`` would lose characters. Therefore:

* every cdscope console is made by :func:`make_console` with markup and emoji off, so a
  string printed on it, or placed in a table on it, shows exactly what it holds;
* messages are :class:`rich.text.Text` built by :func:`say` (and :func:`warn`,
  :func:`wrote`, :func:`dim`): user values are plain parts, styling is an explicit
  ``(text, style)`` part, so they stay verbatim on any console, including a caller's own;
* progress comes from :func:`progress_bar`, whose text columns do not parse markup
  (rich's ``TextColumn`` does by default). On a terminal (or in Jupyter) it is rich's live
  bar; when the console is not a terminal (a log file, SLURM, nohup, CI) a live bar would
  be drawn once, at the end, so it prints one plain line per finished unit instead: what
  finished, done/total, elapsed time and an estimate of the time left; and one line as
  each phase of a unit starts (``LineProgress.phase``: loading a model, proving its writes,
  a training step's rollouts, rewards, backward, probe, regulariser, projection), so a log
  never goes silent for the minutes a unit takes;
* tables are :class:`VerbatimTable`, which turns string titles, headers and cells into
  ``Text``.

``--help`` text is plain too: the Typer app is built with ``rich_markup_mode=None``
(cdscope/cli/common.py).
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

Part = str | tuple[str, str]


def make_console(stderr: bool = True, width: int | None = None, quiet: bool = False) -> Console:
    """A console that prints strings as they are (no markup, no emoji codes)."""
    return Console(stderr=stderr, width=width, markup=False, emoji=False, quiet=quiet)


def message(*parts: Part) -> Text:
    """``Text`` from plain parts (verbatim) and ``(text, style)`` parts (styled)."""
    return Text.assemble(*((str(p) if isinstance(p, str) else p) for p in parts))


def say(console: Any, *parts: Part) -> None:
    """Print one message line; long paths are never wrapped or cut."""
    console.print(message(*parts), soft_wrap=True)


def warn(console: Any, text: str, label: str = "warning:") -> None:
    say(console, (label, "yellow"), " ", text)


def wrote(console: Any, text: str, label: str = "wrote") -> None:
    say(console, (label, "green"), " ", text)


def dim(console: Any, text: str) -> None:
    say(console, (text, "dim"))


def progress_bar(console: Any, *extra_fields: str, transient: bool = False) -> Progress:
    """Description, bar, done/total, elapsed time, then ``{task.fields[NAME]}`` per extra
    field; descriptions and fields are shown verbatim. Where ``console`` is not a terminal,
    one line per advance instead (:class:`LineProgress`)."""
    return LineProgress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        *(TextColumn(f"{{task.fields[{name}]}}", markup=False) for name in extra_fields),
        console=console,
        transient=transient,
        extra_fields=extra_fields,
    )


def clock(seconds: float) -> str:
    """``h:mm:ss``, as rich's elapsed-time column shows it."""
    whole = max(0, round(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class LineProgress(Progress):
    """A rich ``Progress`` that, on a console that is not a terminal (nor Jupyter), draws no
    live bar and prints one line each time a task's completed count grows::

        probing runs/base seed 2: 3/6 done, 0:01:12 elapsed, about 0:01:12 left

    The line names the task's description as it stands when the unit finishes (the
    commands set it to the unit in progress: model and seed, step, problem batch) and the
    values of ``extra_fields``. The time left assumes the units still to do take as long
    as those done since the task was added (resumed units, counted at ``add_task``, are
    left out of the rate).

    ``phase(task, text)`` names what starts now within a unit: the live bar shows it as
    the description; a log gets a line ``text ... (0:01:12 elapsed)``."""

    def __init__(self, *columns: Any, extra_fields: tuple[str, ...] = (), **kwargs: Any) -> None:
        console = kwargs.get("console")
        self.lines = console is not None and not (console.is_terminal or console.is_jupyter)
        super().__init__(*columns, disable=self.lines, **kwargs)
        self.extra_fields = extra_fields
        self.started: dict[TaskID, tuple[float, float]] = {}  # task -> (time, completed) at add

    def add_task(self, description: str, *args: Any, **kwargs: Any) -> TaskID:
        task = super().add_task(description, *args, **kwargs)
        self.started[task] = (time.monotonic(), self._task(task).completed)
        return task

    def update(self, task_id: TaskID, **kwargs: Any) -> None:
        before = self._task(task_id).completed
        super().update(task_id, **kwargs)
        self._line_if_advanced(task_id, before)

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        before = self._task(task_id).completed
        super().advance(task_id, advance)
        self._line_if_advanced(task_id, before)

    def phase(self, task_id: TaskID, description: str) -> None:
        """``description`` starts now: the bar's description, and one line in a log."""
        super().update(task_id, description=description)
        if self.lines:
            start = self.started.get(task_id, (time.monotonic(), 0.0))[0]
            say(self.console, f"{description} ... ({clock(time.monotonic() - start)} elapsed)")

    def _task(self, task_id: TaskID) -> Task:
        return next(task for task in self.tasks if task.id == task_id)

    def _line_if_advanced(self, task_id: TaskID, before: float) -> None:
        task = self._task(task_id)
        if not self.lines or task.completed <= before:
            return
        start, done_at_start = self.started.get(task_id, (time.monotonic(), 0.0))
        elapsed = time.monotonic() - start
        parts = [f"{task.description}: {task.completed:g}"]
        if task.total is not None:
            parts.append(f"/{task.total:g}")
        parts.append(f" done, {clock(elapsed)} elapsed")
        rate_units = task.completed - done_at_start
        if task.total is not None and rate_units > 0:
            left = max(0.0, task.total - task.completed) * elapsed / rate_units
            parts.append(f", about {clock(left)} left" if left > 0 else ", finished")
        for name in self.extra_fields:
            if str(task.fields.get(name, "")).strip():
                parts.append(f"  {task.fields[name]}")
        say(self.console, "".join(parts))


def _plain(value: RenderableType | None, style: str = "") -> RenderableType | None:
    return Text(value, style=style) if isinstance(value, str) else value


class VerbatimTable(Table):
    """A rich ``Table`` whose string title, caption, headers and cells are shown verbatim."""

    def __init__(self, *headers: Any, **kwargs: Any) -> None:
        for key in ("title", "caption"):
            kwargs[key] = _plain(kwargs.get(key), f"table.{key}")  # rich's own styles
        super().__init__(*headers, **kwargs)  # string headers go through add_column

    def add_column(self, header: RenderableType = "", *args: Any, **kwargs: Any) -> None:
        super().add_column(_plain(header), *args, **kwargs)

    def add_row(self, *cells: RenderableType | None, **kwargs: Any) -> None:
        super().add_row(*(_plain(c) for c in cells), **kwargs)
