"""No import circles in ``src/cleanslate``: among its modules, and among its top-level packages.

The graph is read from the source with :mod:`ast`, not by importing anything: an edge A -> B
for every ``import`` / ``from ... import`` in A that names module B of this distribution,
*including* imports inside functions (a lazy import is still a dependency: it only moves the
moment it runs), and *excluding* the bodies of ``if TYPE_CHECKING:`` (those are for the type
checker only). ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to
``pkg``. The modules named in a ``lazy_exports(__name__, {name: module})`` call
(:mod:`cleanslate._lazy`) are edges too. Importing ``a.b.c`` also runs ``a/__init__`` and
``a/b/__init__``; those implicit edges are not counted: a package ``__init__`` that re-exports its
own submodules would otherwise make every package a circle.

A circle is a strongly connected component of more than one module. At the package level every
module is mapped to its top-level package (``cleanslate.probe.gpu.nvml`` -> ``probe``; a module
directly in ``cleanslate/``, such as ``errors``, is its own package) and edges inside one package
are dropped.

Run it as a script (``python tests/test_import_graph.py``) to print the circles, the edge count
and the modules with most lines.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

try:
    from tests._kit import module_files
except ModuleNotFoundError:  # run as a script: tests/ is on the path, not the repository
    from _kit import module_files


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterable[tuple[str, str]]:
    """``(base, name)`` pairs for every import outside ``if TYPE_CHECKING:`` (``name`` is empty
    for ``import base``); relative imports resolved against ``module``."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                if not is_package:
                    anchor = anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                yield base, alias.name
        elif isinstance(node, ast.Call) and _is_lazy_exports(node.func) and len(node.args) > 1:
            # Every string in the mapping's expression (a dict literal, ``dict.fromkeys``):
            # those that name a module of the distribution are kept by the caller.
            for value in ast.walk(node.args[1]):
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    yield value.value, ""
        stack.extend(ast.iter_child_nodes(node))


def _is_lazy_exports(func: ast.expr) -> bool:
    """A call of :func:`cleanslate._lazy.lazy_exports` (its mapping names modules)."""
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    return name == "lazy_exports"


def import_graph(files: Mapping[str, Path] | None = None) -> dict[str, set[str]]:
    """``{module: modules it imports}`` over the distribution's own modules (see the module
    docstring for what counts)."""
    files = module_files() if files is None else files
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for base, item in _imported_names(tree, name, path.name == "__init__.py"):
            target = f"{base}.{item}" if item and f"{base}.{item}" in files else base
            if target in files and target != name:
                graph[name].add(target)
    return graph


def package_of(module: str) -> str:
    """The top-level package of ``module``: ``cleanslate.probe.gpu.nvml`` -> ``probe``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto top-level packages, without edges inside a package."""
    out: dict[str, set[str]] = {package_of(m): set() for m in graph}
    for module, targets in graph.items():
        for target in targets:
            if package_of(target) != package_of(module):
                out[package_of(module)].add(package_of(target))
    return out


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative),
    each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found, key=lambda c: (-len(c), c))


# --- the tests ----------------------------------------------------------------------------------


def test_the_graph_sees_function_level_imports_and_skips_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from demo import b\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from demo import c\n"
        "else:\n    from . import a\n")
    (pkg / "c.py").write_text("from demo.a import f\n")
    (pkg / "d.py").write_text("__getattr__, __dir__ = lazy_exports(__name__, {'f': 'demo.c'})\n")
    graph = import_graph(module_files(tmp_path, "demo"))
    assert graph["demo.a"] == {"demo.b"}
    assert graph["demo.b"] == {"demo.a"}  # the TYPE_CHECKING branch is not an edge, else is
    assert graph["demo.c"] == {"demo.a"}
    assert graph["demo.d"] == {"demo.c"}  # a lazy export is an import of its module
    assert circles(graph) == [["demo.a", "demo.b"]]


def test_no_circle_among_modules() -> None:
    found = circles(import_graph())
    assert found == [], "import circles among modules: " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_circle_among_packages() -> None:
    graph = import_graph()
    found = circles(package_graph(graph))
    detail = []
    for component in found:
        members = set(component)
        edges = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                       if package_of(m) in members and package_of(t) in members
                       and package_of(m) != package_of(t))
        detail.append(" <-> ".join(component) + " (" + ", ".join(edges[:12]) + ")")
    assert found == [], "import circles among packages: " + "; ".join(detail)


def _main() -> None:
    graph = import_graph()
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} edges")
    for component in circles(graph):
        print(f"module circle ({len(component)}): {', '.join(component)}")
    for component in circles(package_graph(graph)):
        print(f"package circle ({len(component)}): {', '.join(component)}")
    sizes = sorted(((len(p.read_text(encoding="utf-8").splitlines()), m)
                    for m, p in module_files().items()), reverse=True)
    for lines, module in sizes[:5]:
        print(f"{lines:5d} {module}")


if __name__ == "__main__":
    sys.exit(_main())
