"""The package's import graph, read from the source with ``ast`` (nothing is imported).

The rules (issue #18, "one place per fact"; the tiers of docs/ARCHITECTURE.md; issue #38's
packages with one face):

* no cycle among cdscope modules, counting imports inside functions too (a lazy import
  for startup speed is fine; one that only dodges a cycle is not);
* no module imports a private name (``_x``) from another module: what modules share is
  public, so it has one owner and one name;
* no upward import between tiers;
* a package with one face (``FACED``) is entered only through it: modules outside it import
  the package, never its modules.

A package face whose names load on first use (``cdscope.lazy.lazy_exports``: the module
names in its ``_EXPORTS``) imports those modules as far as these rules are concerned.

``if TYPE_CHECKING:`` blocks are left out: they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cdscope"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, outside ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                walk(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(tree)
    return found


def absolute(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The module an ``ImportFrom`` names, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def lazy_targets(tree: ast.Module, known: dict[str, Path]) -> set[str]:
    """The modules a lazy face names in its ``_EXPORTS`` (every string in that assignment
    that is a cdscope module)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets):
                found |= {
                    c.value
                    for c in ast.walk(node)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in known
                }
    return found


def edges(known: dict[str, Path]) -> dict[str, set[str]]:
    """importer -> the cdscope modules it imports (``from pkg import mod`` counts mod; a
    lazy face imports the modules of its ``_EXPORTS``)."""
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        graph[name] |= lazy_targets(tree, known) - {name}
        for node in import_nodes(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                source = absolute(node, name, path.name == "__init__.py")
                targets = [
                    f"{source}.{a.name}" if f"{source}.{a.name}" in known else source
                    for a in node.names
                ]
            for target in targets:
                while target and target not in known:  # a.b.c -> the module a.b that holds c
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1 on the stack, 2 finished
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def _package_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph without the edges a submodule has to its own parent packages: importing
    ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, which is not a cycle of ours
    unless those ``__init__`` files themselves import back (those edges stay)."""
    return {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in graph.items()
    }


def test_no_import_cycles() -> None:
    graph = _package_parents(edges(modules()))
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_private_names_imported_across_modules() -> None:
    known = modules()
    offences = []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in import_nodes(tree):
            if isinstance(node, ast.ImportFrom):
                source = absolute(node, name, path.name == "__init__.py")
                if node.module == "__future__" or not source.startswith("cdscope"):
                    continue
                names = [a.name for a in node.names]
            else:
                names = [a.name.rpartition(".")[2] for a in node.names]
                if not any(a.name.startswith("cdscope") for a in node.names):
                    continue
            offences += [
                f"{name}:{node.lineno} imports {n}"
                for n in names
                if n.startswith("_") and not n.startswith("__")
            ]
    assert not offences, "private names imported across modules: " + "; ".join(offences)


# -- the checker itself must be able to fail -------------------------------------------


def test_the_checker_finds_a_cycle_and_a_private_import(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    source = "def f():\n    from cdscope.x import y\nif TYPE_CHECKING:\n    import cdscope.z\n"
    found = import_nodes(ast.parse(source))
    assert [n.module for n in found if isinstance(n, ast.ImportFrom)] == ["cdscope.x"]
    assert len(found) == 1  # the TYPE_CHECKING import is not counted


@pytest.mark.parametrize(
    ("importer", "is_package", "level", "module", "expected"),
    [
        ("cdscope.tasks.io.format", False, 1, "readers", "cdscope.tasks.io.readers"),
        ("cdscope.tasks.io", True, 1, "format", "cdscope.tasks.io.format"),
        ("cdscope.tasks.io.format", False, 2, "record", "cdscope.tasks.record"),
        ("cdscope.tasks.io.format", False, 3, "io", "cdscope.io"),
    ],
)
def test_relative_imports_resolve(
    importer: str, is_package: bool, level: int, module: str, expected: str
) -> None:
    node = ast.ImportFrom(module=module, names=[ast.alias(name="x")], level=level)
    assert absolute(node, importer, is_package) == expected


#: the tiers of docs/ARCHITECTURE.md, lowest first: a module may import its own tier and
#: the tiers below it, never one above (the ground floor is cdscope's top-level modules;
#: the gates (vocabulary and sites: what a gate is, where it hooks) sit below model loading,
#: whose proof installs them, and model loading below the rest of core;
#: the tasks sit above core (the contamination audit reads probe pools), in the order of
#: their packages: the Task record, the sandbox, judging (code verdicts use the sandbox),
#: task I/O (reading a task file checks its verifier kind), then the tasks face;
#: the developer tools, which measure with the whole stack, sit above everything, so no
#: library module may import them)
TIERS = (
    ("ground", ("cdscope.errors", "cdscope.finite", "cdscope.io", "cdscope.messages",
                "cdscope.resources", "cdscope.hooks", "cdscope.settings", "cdscope.distributed",
                "cdscope.schemas", "cdscope.embedded",
                "cdscope.lock", "cdscope.fileset", "cdscope.launch",
                "cdscope.version", "cdscope.lazy")),
    ("analysis", ("cdscope.analysis",)),
    ("gates", ("cdscope.core.gates",)),
    ("models", ("cdscope.core.models",)),
    ("core", ("cdscope.core",)),
    ("task record", ("cdscope.tasks.record",)),
    ("sandbox", ("cdscope.tasks.sandbox",)),
    ("judging", ("cdscope.tasks.judging",)),
    ("task io", ("cdscope.tasks.io",)),
    ("tasks", ("cdscope.tasks",)),
    ("output", ("cdscope.output",)),
    ("train", ("cdscope.train",)),
    ("integrations", ("cdscope.integrations",)),
    ("commands", ("cdscope.commands",)),
    ("cli", ("cdscope.cli", "cdscope.api", "cdscope.__main__")),
    ("package", ("cdscope",)),
    ("tools", ("cdscope.tools",)),
)  # fmt: skip


def tier_of(module: str) -> int:
    """The rank of ``module``'s tier (the longest matching prefix decides)."""
    best = (-1, -1)
    for rank, (_, prefixes) in enumerate(TIERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                best = max(best, (len(prefix), rank))
    assert best[1] >= 0, f"{module} belongs to no tier: add it to TIERS and ARCHITECTURE.md"
    return best[1]


#: upward imports that are known and scheduled to go, each with the issue that removes it
#: (empty since the coverage tool left ``core/models/`` for ``cdscope/tools/``, issue #30)
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a lower tier into a higher one. Edges to parent packages count
    (``from cdscope import __version__`` in the ground floor runs the package face)."""
    return sorted(
        f"{importer} ({TIERS[tier_of(importer)][0]}) imports {target} ({TIERS[tier_of(target)][0]})"
        for importer, targets in graph.items()
        for target in targets
        if tier_of(target) > tier_of(importer) and (importer, target) not in KNOWN_UPWARD
    )


def test_no_upward_imports() -> None:
    upward = upward_imports(edges(modules()))
    assert not upward, upward


def test_known_upward_imports_still_exist() -> None:
    """An allow-list entry whose import is gone must leave the list (it would hide a new one)."""
    graph = edges(modules())
    stale = [pair for pair in KNOWN_UPWARD if pair[1] not in graph.get(pair[0], set())]
    assert not stale, f"remove from KNOWN_UPWARD: {stale}"


def test_upward_check_sees_parent_packages(tmp_path: Path) -> None:
    """The edge a ground module has to the package face is one the check reports."""
    graph = {"cdscope.io": {"cdscope", "cdscope.errors"}, "cdscope.errors": set(), "cdscope": set()}
    assert upward_imports(graph) == ["cdscope.io (ground) imports cdscope (package)"]


def test_tier_check_can_fail() -> None:
    assert tier_of("cdscope.analysis.spectral") < tier_of("cdscope.core.gating.model")
    assert tier_of("cdscope.core.models.loading") < tier_of("cdscope.tools.coverage")
    assert upward_imports({"cdscope.core.eap": {"cdscope.tools.tiny"}, "cdscope.tools.tiny": set()})
    assert tier_of("cdscope.core.models.loading") < tier_of("cdscope.core.control")
    assert tier_of("cdscope.commands.probe") > tier_of("cdscope.output.frames")
    assert tier_of("cdscope.tasks.sandbox.harness") < tier_of("cdscope.tasks.judging.code")
    assert tier_of("cdscope.tasks.judging") < tier_of("cdscope.tasks.io.format")
    assert upward_imports({"cdscope.tasks.sandbox.harness": {"cdscope.tasks.judging"}})
    with pytest.raises(AssertionError):
        tier_of("elsewhere.module")


#: packages entered only through their face (issue #38: "how an answer is judged" in one
#: place, behind one door)
FACED = ("cdscope.tasks.sandbox", "cdscope.tasks.judging", "cdscope.tasks.io")


def past_the_face(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module inside a faced package from a module outside it."""
    return sorted(
        f"{importer} imports {target} (use {package})"
        for importer, targets in graph.items()
        for target in targets
        for package in FACED
        if target.startswith(package + ".")
        and not importer.startswith(package + ".")
        and importer != package
    )


def test_faced_packages_are_entered_through_their_face() -> None:
    offences = past_the_face(edges(modules()))
    assert not offences, offences


def test_face_check_can_fail() -> None:
    inside = {"cdscope.tasks.judging.code": {"cdscope.tasks.sandbox.harness"}}
    assert past_the_face(inside) == [
        "cdscope.tasks.judging.code imports cdscope.tasks.sandbox.harness "
        "(use cdscope.tasks.sandbox)"
    ]
    assert not past_the_face({"cdscope.tasks.judging.code": {"cdscope.tasks.sandbox"}})
    assert not past_the_face({"cdscope.tasks.sandbox.harness": {"cdscope.tasks.sandbox.layers"}})


def test_lazy_faces_count_as_imports() -> None:
    """A lazy face's names are its imports: without them the tier and cycle checks would
    not see what ``from cdscope.tasks import verify`` loads."""
    graph = edges(modules())
    assert "cdscope.tasks.judging.verifiers" in graph["cdscope.tasks.judging"]
    assert "cdscope.core.models.loading" in graph["cdscope.core.models"]
