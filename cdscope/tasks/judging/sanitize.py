"""Keep the program a code completion needs, drop the demo around it (EvalPlus's design).

Chat models answer a coding task with a fenced program: imports, helper functions, a
class or constants, the entry point -- and often example calls, prints, asserts or an
``if __name__ == "__main__":`` block after it. ``sanitize_program`` reads the program
with ``ast`` and keeps, in source order:

* every import (and a top-level ``try`` holding only imports),
* the definitions -- functions, classes, assignments to names, and the loops, ``if``,
  ``with`` and ``try`` blocks and method calls (``TABLE.append(...)``) that assign to or
  fill a name -- reachable from the entry point through the free names it uses (a
  helper, a constant, a class the entry point instantiates, a table a module-level loop
  fills, a helper's own helpers; a function's parameters and locals are not free, so a
  demo loop over ``x`` is not kept for a function of ``x``),
* ``sys.setrecursionlimit(...)`` calls (a recursive solution needs them),

and drops everything else at the top level: expression statements (prints, example
calls), asserts, loops that fill nothing needed, ``if __name__ == "__main__":`` blocks,
unreachable definitions.
A program that does not parse as a whole is cut back, at top-level line boundaries from
its end, to the longest prefix that parses (prose after an unfenced program), at most
``MAX_CUTS`` times. The result is None when no parse defines the entry point; the caller
then falls back to the plain text (and the child reports the syntax error).
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Iterator

from cdscope.tasks.sandbox import parse_python

MAX_CUTS = 32
MAX_SOURCE = 64 * 1024  # characters of a program read at all (one parse: ~0.1 s)
_TOP_LEVEL_LINE = re.compile(r"^\S", re.MULTILINE)
# the info line is taken whole, its language read from it in Python: a language pattern
# followed by [^\n]* backtracked quadratically over "```aaaa…" without a newline
_FENCE = re.compile(r"^[ \t]*```([^\n]*)\n(.*?)(?:^[ \t]*```|\Z)", re.M | re.S)
_LANGUAGE = re.compile(r"[ \t]*([A-Za-z0-9_+.-]*)")
_CODE_START = re.compile(
    r"^(?:from\s+[\w.]+\s+import\b|import\s+\w|def\s|async\s+def\s|class\s|@)", re.M
)
_NOT_PYTHON = {"", "python", "python3", "py", "py3", "pycon", "ipython"}


def fenced_blocks(text: str) -> list[str]:
    """The contents of the markdown code fences in ``text`` (an unclosed last one too),
    leaving out blocks labelled as another language (```bash, ```text, ...)."""
    return [m.group(2) for m in _FENCE.finditer(text) if _language(m.group(1)) in _NOT_PYTHON]


def _language(info: str) -> str:
    """The language of a fence's info line (``python title=x`` -> ``python``)."""
    match = _LANGUAGE.match(info)
    return match.group(1).lower() if match is not None else ""


def code_start(text: str, before: int) -> int:
    """Where the code of an unfenced completion starts: the first import / def / class /
    decorator line at or before index ``before`` (prose ahead of it is dropped)."""
    match = _CODE_START.search(text, 0, before + 1)
    return match.start() if match is not None else before


class ReadingTimeout(Exception):
    """The verdict's deadline passed while the program was being read."""


def _parse_prefix(source: str, deadline: float | None) -> ast.Module | None:
    """``source`` parsed, or its longest parsing prefix cut at top-level lines; the
    deadline is checked before each parse (ReadingTimeout): 33 parses of a 250 KiB
    completion took 1.9-3.9 s before the verdict's deadline had even started."""
    cuts = [m.start() for m in _TOP_LEVEL_LINE.finditer(source)][::-1][:MAX_CUTS]
    for end in [len(source), *cuts]:
        if end == 0:
            break
        if deadline is not None and time.monotonic() > deadline:
            raise ReadingTimeout
        try:
            return parse_python(source[:end])
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
    return None


_DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
_BLOCKS = (ast.For, ast.AsyncFor, ast.While, ast.If, ast.With, ast.AsyncWith, ast.Try)


def _defined(node: ast.stmt) -> set[str]:
    """The names a top-level statement defines, assigns to or fills."""
    if isinstance(node, _DEFINITIONS):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, ast.Expr):  # TABLE.append(...), memo.update(...)
        return _receiver(node)
    if isinstance(node, _BLOCKS) and not _is_main_guard(node):
        return set().union(
            *(_defined(s) for s in ast.walk(node) if isinstance(s, ast.stmt) and s is not node)
        )
    return set()


def _receiver(node: ast.Expr) -> set[str]:
    call = node.value
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
        owner = call.func.value
        return {owner.id} if isinstance(owner, ast.Name) else set()
    return set()


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (the program runs as ``__main__`` in the child)."""
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
    )


def _used(node: ast.AST) -> set[str]:
    """The free names of a statement: what it loads and does not bind itself (a
    function's parameters, locals, nested definitions and imports are bound; names it
    declares ``global`` are free)."""
    loaded, bound, declared = set(), set(), set()
    for child in ast.walk(node):
        if isinstance(child, ast.Name):
            (loaded if isinstance(child.ctx, ast.Load) else bound).add(child.id)
        elif isinstance(child, ast.arg):
            bound.add(child.arg)
        elif isinstance(child, ast.Global | ast.Nonlocal):
            declared.update(child.names)
        elif isinstance(child, ast.Import | ast.ImportFrom):
            bound.update((a.asname or a.name).split(".")[0] for a in child.names)
        elif isinstance(child, _DEFINITIONS) and child is not node:
            bound.add(child.name)
    return (loaded - bound) | declared


def _is_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.Import | ast.ImportFrom):
        return True
    if isinstance(node, ast.Try):
        body = [*node.body, *(s for h in node.handlers for s in h.body), *node.orelse]
        return all(isinstance(s, ast.Import | ast.ImportFrom | ast.Pass) for s in body)
    return False


def _is_recursion_limit(node: ast.stmt) -> bool:
    call = node.value if isinstance(node, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "setrecursionlimit"
    )


def _on_time(deadline: float | None, step: int) -> None:
    """ReadingTimeout once ``deadline`` has passed (looked at every 256th step)."""
    if deadline is not None and step % 256 == 0 and time.monotonic() > deadline:
        raise ReadingTimeout


def _kept(body: list[ast.stmt], entry_point: str, deadline: float | None) -> Iterator[ast.stmt]:
    definitions = []
    for step, node in enumerate(body):
        _on_time(deadline, step)
        definitions.append((node, _defined(node)))
    by_name: dict[str, list[ast.stmt]] = {}
    for node, names in definitions:
        for name in names:
            by_name.setdefault(name, []).append(node)
    if entry_point not in by_name:
        return
    wanted, frontier, step = {entry_point}, [entry_point], 0
    while frontier:  # each definition is walked at most once per name it defines
        for node in by_name.get(frontier.pop(), []):
            step += 1
            _on_time(deadline, step)
            for used in _used(node) - wanted:
                wanted.add(used)
                frontier.append(used)
    for node, names in definitions:
        if _is_import(node) or _is_recursion_limit(node) or names & wanted:
            yield node


def _segments(source: str, body: list[ast.stmt], kept: list[ast.stmt]) -> Iterator[str]:
    """Each kept statement's own lines; ``ast.unparse`` where it shares a line."""
    lines = source.splitlines(keepends=True)
    shared = {
        index
        for index in range(len(body))
        for other in (index - 1, index + 1)
        if 0 <= other < len(body)
        and body[other].lineno <= body[index].end_lineno  # type: ignore[operator]
        and body[index].lineno <= body[other].end_lineno  # type: ignore[operator]
    }
    position = {id(node): index for index, node in enumerate(body)}
    for node in kept:
        if position[id(node)] in shared:
            yield ast.unparse(node) + "\n"
            continue
        decorators = getattr(node, "decorator_list", [])
        start = min([node.lineno, *(d.lineno for d in decorators)])
        text = "".join(lines[start - 1 : node.end_lineno])
        yield text if text.endswith("\n") else text + "\n"


def sanitize_program(source: str, entry_point: str, deadline: float | None = None) -> str | None:
    """The parts of ``source`` the entry point needs (module docstring), or None when no
    parse of it defines ``entry_point``; ReadingTimeout when ``deadline``
    (``time.monotonic`` seconds) passes first."""
    if len(source) > MAX_SOURCE:
        return None
    tree = _parse_prefix(source, deadline)
    if tree is None:
        return None
    kept = list(_kept(tree.body, entry_point, deadline))
    if not kept:
        return None
    return "".join(_segments(source, tree.body, kept))
