"""The core's internal import order (pyproject's "The core's internal order" contract): the
upward edges it lets through must be annotation-only, imported under ``if TYPE_CHECKING:``,
so that at run time the core's modules still import one way."""

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
