"""Import order inside the package. The core (pyproject's "The core's internal order"
contract): the upward edges it lets through must be annotation-only, imported under ``if
TYPE_CHECKING:``, so that at run time the core's modules still import one way. The compiled
core's ``.pxd`` declarations, and the modules of ``aioengine/array``, import with no cycle at all
(annotations and imports inside functions count too)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONTRACT = "The core's internal order (annotation-only edges allowed)"


def allowed_edges() -> list[tuple[str, str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["name"] == CONTRACT:
            edges = [tuple(e.split(" -> ")) for e in contract["ignore_imports"]]
            return [(a.removeprefix("aioengine."), b.removeprefix("aioengine.")) for a, b in edges]
    raise AssertionError(f"pyproject.toml has no contract named {CONTRACT!r}")


def imports_of(module: str, target: str) -> list[tuple[int, bool]]:
    """Every import of ``target`` in ``module``: (line, whether under ``if TYPE_CHECKING``)."""
    tree = ast.parse((ROOT / "aioengine" / f"{module}.py").read_text(encoding="utf-8"))
    found: list[tuple[int, bool]] = []

    def visit(node: ast.AST, guarded: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = guarded
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, guarded)
                continue
            visit_stmt(child, inner)

    def visit_stmt(stmt: ast.AST, guarded: bool) -> None:
        if isinstance(stmt, ast.ImportFrom):
            name = ("." * stmt.level) + (stmt.module or "")
            if name in (f".{target}", f"aioengine.{target}") or (
                name == "." and any(alias.name == target for alias in stmt.names)
            ):
                found.append((stmt.lineno, guarded))
        elif isinstance(stmt, ast.Import):
            if any(alias.name == f"aioengine.{target}" for alias in stmt.names):
                found.append((stmt.lineno, guarded))
        else:
            visit(stmt, guarded)

    visit(tree, False)
    return found


def test_every_upward_edge_of_the_core_is_annotation_only() -> None:
    edges = allowed_edges()
    assert edges, "the contract lets no edge through: nothing to check"
    for module, target in edges:
        found = imports_of(module, target)
        assert found, f"{module} no longer imports {target}: drop the edge from pyproject.toml"
        runtime = [line for line, guarded in found if not guarded]
        assert not runtime, f"aioengine/{module}.py imports {target} at run time, line {runtime}"


def test_the_checker_sees_a_run_time_import() -> None:
    """The parser above must tell the two kinds apart: scheduler imports var at run time."""
    assert imports_of("scheduler", "var")
    assert not all(guarded for _, guarded in imports_of("scheduler", "var"))
    assert all(guarded for _, guarded in imports_of("var", "operation"))


def cimport_graph() -> dict[str, set[str]]:
    """Which ``.pxd`` files each ``.pxd`` file of the package cimports (``from .x cimport``)."""
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "aioengine").glob("*.pxd")):
        targets = set()
        for line in path.read_text(encoding="utf-8").splitlines():
            words = line.split()
            if len(words) >= 3 and words[0] == "from" and words[2] == "cimport":
                source = words[1]
                if source.startswith("."):
                    targets.add(source.lstrip("."))
        graph[path.stem] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of ``graph`` found by a depth-first search (each once, from where it was
    entered)."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            found.append([*path[path.index(node) :], node])
            return
        if node in done:
            return
        for target in sorted(graph.get(node, ())):
            visit(target, [*path, node])
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    return found


def test_no_pxd_file_cimports_one_that_cimports_it_back() -> None:
    # The compiled core's declarations form a graph with no cycle: bulk.pxd types the
    # scheduler as its base CoreState (corestate.pxd), which scheduler.pxd derives from.
    graph = cimport_graph()
    assert {"scheduler", "bulk", "corestate", "operation", "var"} <= set(graph)
    assert "corestate" in graph["bulk"]
    assert "bulk" in graph["scheduler"]
    assert cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def array_import_graph() -> dict[str, set[str]]:
    """Which modules of ``aioengine/array`` each one imports: every import of a sibling
    (``from .x import``, ``from . import x``), wherever it is (under ``if TYPE_CHECKING:``,
    inside a function)."""
    package = ROOT / "aioengine" / "array"
    modules = {path.stem for path in package.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level == 1 and module:
                    targets.add(module.split(".")[0])
                elif node.level == 1:
                    targets.update(alias.name for alias in node.names)
                elif node.level == 0 and module.startswith("aioengine.array."):
                    targets.add(module.split(".")[2])
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("aioengine.array."):
                        targets.add(alias.name.split(".")[2])
        graph[path.stem] = (targets & modules) - {path.stem}
    return graph


def test_the_array_package_imports_one_way() -> None:
    # A reader follows ``c = a + b`` from the operator down to the engine push without
    # coming back: the layers are in aioengine/array/__init__.py's docstring. A name that a
    # lower module needs of a higher one is a Protocol of what it uses, or the lower base
    # class that defines it, never an import (not even for annotations).
    graph = array_import_graph()
    assert {"_array", "_buffer", "_kernel", "_namespace", "_push"} <= set(graph)
    assert "_kernel" in graph["_buffer"]
    assert "_array" in graph["_push"]
    found = cycles(graph)
    assert not found, "aioengine/array imports in a cycle: " + "; ".join(
        " -> ".join(cycle) for cycle in found
    )
