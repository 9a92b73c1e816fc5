"""The import graph of ``src/pylog`` has no cycle, and imports stay at the top of modules.

The layer contracts themselves are checked by ``lint-imports`` (``[tool.importlinter]`` in pyproject.toml);
this test adds what they do not say: no two modules import each other, even within one layer, and a
function-level import of a pylog module exists only to keep an optional dependency (pyarrow, pyspark,
Hypothesis) from being imported with pylog.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

# function-level imports that keep an optional dependency lazy: (module, imported module)
LAZY = {
    ("pylog.consumer", "pylog.arrow"),  # pyarrow
    ("pylog.demo", "pylog.spark.jvm"),  # pyspark
    ("pylog.spark", "pylog.spark.source"),  # pyspark, when the source is registered
    ("pylog.broker", "pylog.broker.broker"),  # kio and cramjam (the broker extra), when pylog.serve is called
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in (SRC / "pylog").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(tree: ast.Module, modules: dict[str, Path], here: str) -> Iterator[tuple[ast.AST, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pylog"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                target = full if full in modules else node.module
                if target != here:
                    yield node, target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pylog") and alias.name != here:
                    yield node, alias.name


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for inner in ast.walk(node)
    }


def _graph() -> tuple[dict[str, set[str]], set[tuple[str, str]]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    local: set[tuple[str, str]] = set()
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        in_functions = {
            id(inner)
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
            for inner in ast.walk(fn)
        }
        for node, target in _imports(tree, modules, name):
            if id(node) in skip:
                continue
            graph[name].add(target)
            if id(node) in in_functions:
                local.add((name, target))
    return graph, local


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    graph, _ = _graph()
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_function_level_imports_only_keep_optional_dependencies_lazy() -> None:
    _, local = _graph()
    assert local <= LAZY, sorted(local - LAZY)
