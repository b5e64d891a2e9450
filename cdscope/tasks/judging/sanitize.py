"""Keep the program a code completion needs, drop the demo around it (EvalPlus's design).

Chat models answer a coding task with a fenced program: imports, helper functions, a
class or constants, the entry point -- and often example calls, prints, asserts or an
``if __name__ == "__main__":`` block after it. ``sanitize_program`` reads the program
with ``ast`` and keeps, in source order:

* every import (and a top-level ``try`` holding only imports),
* the definitions -- functions, classes, assignments to names -- reachable from the
  entry point through the names they use (a helper, a constant, a class the entry point
  instantiates, a helper's own helpers),
* ``sys.setrecursionlimit(...)`` calls (a recursive solution needs them),

and drops everything else at the top level: expression statements (prints, example
calls), asserts, loops, ``if __name__ == "__main__":`` blocks, unreachable definitions.
A program that does not parse as a whole is cut back, at top-level line boundaries from
its end, to the longest prefix that parses (prose after an unfenced program), at most
``MAX_CUTS`` times. The result is None when no parse defines the entry point; the caller
then falls back to the plain text (and the child reports the syntax error).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

MAX_CUTS = 32
MAX_SOURCE = 256 * 1024  # characters read at all
_TOP_LEVEL_LINE = re.compile(r"^\S", re.MULTILINE)
_FENCE = re.compile(
    r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.M | re.S
)
_CODE_START = re.compile(
    r"^(?:from\s+[\w.]+\s+import\b|import\s+\w|def\s|async\s+def\s|class\s|@)", re.M
)
_NOT_PYTHON = {"", "python", "python3", "py", "py3", "pycon", "ipython"}


def fenced_blocks(text: str) -> list[str]:
    """The contents of the markdown code fences in ``text`` (an unclosed last one too),
    leaving out blocks labelled as another language (```bash, ```text, ...)."""
    return [m.group(2) for m in _FENCE.finditer(text) if m.group(1).lower() in _NOT_PYTHON]


def code_start(text: str, before: int) -> int:
    """Where the code of an unfenced completion starts: the first import / def / class /
    decorator line at or before index ``before`` (prose ahead of it is dropped)."""
    match = _CODE_START.search(text, 0, before + 1)
    return match.start() if match is not None else before


def _parse_prefix(source: str) -> ast.Module | None:
    """``source`` parsed, or its longest parsing prefix cut at top-level lines."""
    cuts = [m.start() for m in _TOP_LEVEL_LINE.finditer(source)][::-1][:MAX_CUTS]
    for end in [len(source), *cuts]:
        if end == 0:
            break
        try:
            return ast.parse(source[:end])
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
    return None


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


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


def _kept(body: list[ast.stmt], entry_point: str) -> Iterator[ast.stmt]:
    definitions = [(node, _defined(node)) for node in body]
    by_name: dict[str, list[ast.stmt]] = {}
    for node, names in definitions:
        for name in names:
            by_name.setdefault(name, []).append(node)
    if entry_point not in by_name:
        return
    wanted, frontier = {entry_point}, [entry_point]
    while frontier:  # each definition is walked at most once per name it defines
        for node in by_name.get(frontier.pop(), []):
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


def sanitize_program(source: str, entry_point: str) -> str | None:
    """The parts of ``source`` the entry point needs (module docstring), or None when no
    parse of it defines ``entry_point``."""
    if len(source) > MAX_SOURCE:
        return None
    tree = _parse_prefix(source)
    if tree is None:
        return None
    kept = list(_kept(tree.body, entry_point))
    if not kept:
        return None
    return "".join(_segments(source, tree.body, kept))
