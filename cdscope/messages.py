"""The one place cdscope's text reaches the terminal: verbatim, never parsed as markup.

Rich reads ``[...]`` in plain strings as markup (``[bold]``, ``[/]``, ``[link=x]``) and
``:name:`` as emoji codes, so a path like ``runs/lr[2e-6]`` or a hint like
``pip install 'cdscope[trl]'`` would lose characters. Therefore:

* every cdscope console is made by :func:`make_console` with markup and emoji off, so a
  string printed on it, or placed in a table on it, shows exactly what it holds;
* messages are :class:`rich.text.Text` built by :func:`say` (and :func:`warn`,
  :func:`wrote`, :func:`dim`): user values are plain parts, styling is an explicit
  ``(text, style)`` part, so they stay verbatim on any console, including a caller's own;
* progress bars come from :func:`progress_bar`, whose text columns do not parse markup
  (rich's ``TextColumn`` does by default);
* tables are :class:`VerbatimTable`, which turns string titles, headers and cells into
  ``Text``.

``--help`` text is plain too: the Typer app is built with ``rich_markup_mode=None``
(cdscope/cli/common.py).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

Part = str | tuple[str, str]


def make_console(stderr: bool = True, width: int | None = None) -> Console:
    """A console that prints strings as they are (no markup, no emoji codes)."""
    return Console(stderr=stderr, width=width, markup=False, emoji=False)


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
    field; descriptions and fields are shown verbatim."""
    return Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        *(TextColumn(f"{{task.fields[{name}]}}", markup=False) for name in extra_fields),
        console=console,
        transient=transient,
    )


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
