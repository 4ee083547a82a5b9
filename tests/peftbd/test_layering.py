"""The library's layering (docs/architecture.md) and its lack of import cycles, read from its import
statements (nothing is imported)."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterable, Mapping
from pathlib import Path

PEFTBD = Path(__file__).resolve().parents[2] / "peftbd"

ONLY: dict[str, set[str]] = {
    "decoding": {"models"},  # the engine: no config, CLI, data, benchmark or report code
    "cost_model": set(),  # a leaf: the benchmark, the speed check and the oracle CLI use it
}
"""Top-level unit of peftbd (package or module) -> the only other units it may import."""

REPORTS = "analysis"
"""Reads benchmarking's results (and stage manifests); no other library unit imports it, so
benchmarking and analysis depend one way only."""

ABOVE_REPORTS = {"simulation"}
"""Units that write the ledgers analysis reads (the placement simulator: `RequestRecord`,
`Window`) and so may import it; no other library unit imports them."""


def imported_modules(path: Path) -> set[str]:
    """Every module an import statement in `path` names (the library uses no relative imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def violations() -> list[str]:
    """`file: what it must not import`, over every library file."""
    found = []
    for path in sorted(PEFTBD.rglob("*.py")):
        own = path.relative_to(PEFTBD).with_suffix("").parts[0]
        names = imported_modules(path)
        units = {n.split(".")[1] for n in names if n.startswith("peftbd.")} - {own}
        bad = sorted(units - ONLY[own] if own in ONLY
                     else units & ABOVE_REPORTS if own in ABOVE_REPORTS or own == REPORTS
                     else units & ({REPORTS} | ABOVE_REPORTS))
        bad += sorted(n for n in names if n.split(".")[0] == "ray")  # the library never imports Ray
        found += [f"{path.relative_to(PEFTBD.parent)}: {b}" for b in bad]
    return found


def test_imports_follow_the_layering():
    assert violations() == []


def import_graph(root: Path = PEFTBD) -> dict[str, set[str]]:
    """Module of the package at `root` -> the package's modules it imports anywhere in its file
    (inside functions and under `if TYPE_CHECKING:` too): for `from a import b`, `a` and, when
    it is a module, `a.b`. A package's `__init__` is the package's own name; importing a
    submodule adds no edge to its parent package."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def module_of(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        named: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                named |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                named |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        graph[name] = {module_of(n) for n in named} - {"", name}
    return graph


def import_cycle(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """One cycle of `graph` as its modules, the first repeated at the end ([]: none)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        return list(err.args[1])
    return []


def test_the_library_has_no_import_cycle():
    cycle = import_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_imports_in_functions_and_for_type_checking_count(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for init in (pkg / "__init__.py", pkg / "sub" / "__init__.py"):
        init.write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n")
    graph = import_graph(pkg)
    assert graph == {"pkg": set(), "pkg.sub": set(), "pkg.a": {"pkg.sub", "pkg.sub.b"},
                     "pkg.sub.b": {"pkg.a"}}
    assert sorted(import_cycle(graph)[:-1]) == ["pkg.a", "pkg.sub.b"]
