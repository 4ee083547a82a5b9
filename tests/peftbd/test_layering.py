"""The library's layering (docs/architecture.md), read from its import statements (nothing is imported)."""

from __future__ import annotations

import ast
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
        bad = sorted(units - ONLY[own] if own in ONLY else units & {REPORTS})
        bad += sorted(n for n in names if n.split(".")[0] == "ray")  # the library never imports Ray
        found += [f"{path.relative_to(PEFTBD.parent)}: {b}" for b in bad]
    return found


def test_imports_follow_the_layering():
    assert violations() == []
