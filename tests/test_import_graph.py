"""The package's import graph (DESIGN.md section 2): no cycles, and only the package's names
reach an entrance. The layering itself is import-linter's contracts (pyproject.toml,
``lint-imports``).

Every import counts, at module level, inside a function (a deferred import still ties the two
modules together) or under ``if TYPE_CHECKING:`` (a type hint ties them too: one module cannot
be read, or type-checked, without the other).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbmonitor

ROOT = Path(nbmonitor.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _package(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def imported(name: str) -> set[str]:
    """The nbmonitor modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in _imports(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in MODULES}
            continue
        base = node.module or ""
        if node.level:
            anchor = _package(name).split(".")
            base = ".".join(anchor[: len(anchor) - node.level + 1] + ([base] if base else []))
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            if sub in MODULES:
                found.add(sub)
            elif base in MODULES:
                found.add(base)
    found.discard(name)
    return found


GRAPH = {name: imported(name) for name in MODULES}


def cycles() -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
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
                out.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return out


def test_the_graph_is_read() -> None:
    # The test would pass on an empty graph: check it sees the edges it is about.
    assert "nbmonitor.live.monitor" in GRAPH["nbmonitor.live"]
    assert "nbmonitor.replay.run" in GRAPH["nbmonitor.replay.job"]
    assert "nbmonitor._engine.frame" in GRAPH["nbmonitor.replay.run"]
    # A type hint's import (under ``if TYPE_CHECKING:``) counts too.
    assert "nbmonitor._engine.run_model" in GRAPH["nbmonitor._engine.frame_builder"]


def test_no_import_cycles() -> None:
    assert cycles() == []


def test_a_cycle_is_found() -> None:
    GRAPH["nbmonitor.errors"].add("nbmonitor.live.monitor")
    try:
        assert any("nbmonitor.errors" in c for c in cycles())
    finally:
        GRAPH["nbmonitor.errors"].discard("nbmonitor.live.monitor")


def _in(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# Only the package's names (and the CLI, the adapters) reach an entrance; that the entrances
# never import each other is an import-linter independence contract (pyproject.toml).
ENTRANCE_USERS = {
    "nbmonitor.live": ("nbmonitor.integrations",),
    "nbmonitor.replay": ("nbmonitor.__main__",),
    "nbmonitor.machine": ("nbmonitor.__main__",),
}


@pytest.mark.parametrize("entrance", sorted(ENTRANCE_USERS))
def test_only_the_package_names_reach_an_entrance(entrance: str) -> None:
    # nbmonitor/__init__ (the lazy public names) and the entrance's own modules may too.
    allowed = ("nbmonitor", entrance, *ENTRANCE_USERS[entrance])
    wrong = sorted(
        f"{a} -> {b}"
        for a, deps in GRAPH.items()
        if a != "nbmonitor" and not any(_in(a, p) for p in allowed[1:])
        for b in deps
        if _in(b, entrance)
    )
    assert wrong == []


# What ui/ may reach of the engine, directly or not: the hand-off types (frame.py) and the
# data they carry (the memory table, the ranks frame and the stores they read). import-linter
# says which engine modules ui/ never reaches; this says the only ones it does, so that a new
# engine module, or a new import of frame.py, is decided here.
HAND_OFF = {
    "nbmonitor._engine",
    "nbmonitor._engine.frame",
    "nbmonitor._engine.derive",
    "nbmonitor._engine.derive.memory_table",
    "nbmonitor._engine.derive.ranks_frame",
    "nbmonitor._engine.derive.ranks",
    "nbmonitor._engine.store",
    "nbmonitor._engine.tiering",
    "nbmonitor._engine.decimate",
}


def reached(start: set[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(start)
    while stack:
        for dep in GRAPH[stack.pop()]:
            if dep not in seen:
                seen.add(dep)
                stack.append(dep)
    return seen


def test_ui_reaches_only_the_hand_off_types_of_the_engine() -> None:
    ui = {name for name in GRAPH if _in(name, "nbmonitor.ui")}
    engine = {name for name in reached(ui) if _in(name, "nbmonitor._engine")}
    assert "nbmonitor._engine.frame" in engine  # the graph is read
    assert engine - HAND_OFF == set()
