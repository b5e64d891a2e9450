"""HTML pieces for notebooks (``_repr_html_``) and the ``cdscope report`` page.

Every text that reaches the page goes through ``html.escape`` here (model names and paths
are user input: ``<script>`` in a run folder's name must stay text). Figures are inlined
as base64 PNG ``<img>`` so a page is one self-contained file. No external resource (font,
script, style sheet) is referenced.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable, Sequence
from typing import Any

#: the page's only style sheet (inline); tables read like the terminal ones
STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #1d1d1f; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; }
h2 { font-size: 1.3em; margin-top: 2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
table.cdscope { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
table.cdscope th, table.cdscope td { padding: 0.25em 0.7em; border-bottom: 1px solid #e4e4e4; }
table.cdscope th { text-align: left; background: #f4f6f8; }
table.cdscope td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.cdscope caption { caption-side: bottom; text-align: left; color: #666;
                        font-size: 0.85em; padding-top: 0.3em; }
img.figure { max-width: 100%; height: auto; border: 1px solid #eee; margin: 0.5em 0; }
.verdict { padding: 0.6em 1em; border-radius: 4px; font-weight: 600; margin: 0.8em 0; }
.verdict.pass { background: #e6f4ea; color: #1e5e2e; }
.verdict.fail { background: #fce8e6; color: #8c1d18; }
.note { color: #555; font-size: 0.9em; }
details > summary { cursor: pointer; color: #1f4e79; }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 0.15em 1em;
          font-size: 0.85em; }
dl.meta dt { color: #555; }
dl.meta dd { margin: 0; font-family: ui-monospace, monospace; word-break: break-all; }
"""


def text(value: object) -> str:
    """``value`` as escaped HTML text."""
    return html.escape(str(value), quote=True)


def element(tag: str, content: str, **attributes: object) -> str:
    """``<tag attr="...">content</tag>``; ``content`` is HTML already, attributes are
    escaped (``class_`` gives ``class``)."""
    attrs = "".join(
        f' {name.rstrip("_").replace("_", "-")}="{text(value)}"'
        for name, value in attributes.items()
        if value is not None
    )
    return f"<{tag}{attrs}>{content}</{tag}>"


def _is_number(cell: str) -> bool:
    """Cells right-aligned as numbers: '80.04 ± 0.37', '-23.5', '[1.2, 3.4]', '3/3'."""
    stripped = cell.strip().lstrip("[+-−")
    return bool(stripped) and (stripped[0].isdigit() or stripped in ("n/a", "nan", "inf"))


def table(
    headers: Sequence[str], rows: Iterable[Sequence[object]], caption: str | None = None
) -> str:
    """An HTML table of plain-text cells (escaped; numbers right-aligned)."""
    head = "".join(element("th", text(h)) for h in headers)
    body = []
    for row in rows:
        cells = [str(c) for c in row]
        body.append(
            "".join(element("td", text(c), class_="num" if _is_number(c) else None) for c in cells)
        )
    parts = [element("thead", element("tr", head))]
    parts.append(element("tbody", "".join(element("tr", r) for r in body)))
    if caption:
        parts.insert(0, element("caption", text(caption)))
    return element("table", "".join(parts), class_="cdscope")


def _plain(cell: object) -> str:
    """A rich cell (Text or str) as plain text."""
    return getattr(cell, "plain", None) or str(cell if cell is not None else "")


def rich_table(source: Any) -> str:
    """A rich ``Table`` (the terminal's: render.py, render_runs.py) as an HTML table with the
    same title, headers, cells and caption; a bold row (a domain mean, overall) stays bold
    and a cell's second line (a bootstrap interval) goes on a second line."""
    headers = [_plain(c.header) for c in source.columns]
    columns = [[_plain(cell) for cell in c.cells] for c in source.columns]
    body = []
    for i, cells in enumerate(zip(*columns, strict=True)):
        style = source.rows[i].style if i < len(source.rows) else None
        bold = style is not None and "bold" in str(style)
        tds = "".join(
            element("td", "<br>".join(text(line) for line in c.split("\n")),
                    class_="num" if _is_number(c) else None)
            for c in cells
        )  # fmt: skip
        body.append(element("tr", tds, style="font-weight: 600" if bold else None))
    parts = [element("thead", element("tr", "".join(element("th", text(h)) for h in headers)))]
    parts.append(element("tbody", "".join(body)))
    if source.caption:
        parts.insert(0, element("caption", text(_plain(source.caption))))
    title = element("h3", text(_plain(source.title))) if source.title else ""
    return title + element("table", "".join(parts), class_="cdscope")


def figure(fig: Any, alt: str, dpi: int = 110) -> str:
    """A matplotlib figure as an inline base64 PNG ``<img>`` (self-contained)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img class="figure" alt="{text(alt)}" src="data:image/png;base64,{data}">'


def definitions(items: Iterable[tuple[str, object]]) -> str:
    """A ``<dl>`` of name / value pairs (run metadata)."""
    body = "".join(element("dt", text(k)) + element("dd", text(v)) for k, v in items)
    return element("dl", body, class_="meta")


def page(title: str, body: str) -> str:
    """A complete HTML5 document: ``title`` escaped, ``body`` HTML, the inline style."""
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{text(title)}</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>\n"
    )
