"""Every third-party package the code imports is declared in pyproject.toml, so README's commands
work on a fresh machine: `pip install -e ".[dev]"` (scripts/install.sh) installs all of them.

The code (peftbd/, jobs/, serve_apps/, scripts/) may import only what [project].dependencies
declares; the tests may also import what the `dev` extra declares. A package that only arrives
as another's dependency does not count: it must be declared directly. No import is exempt (none
is an optional import guarded by `except ImportError`) but those of a file that another
environment's Python runs (SIDE_ENVIRONMENTS: vLLM's side process, in the environment
`scripts/install.sh --with-vllm` makes); `tomli` below is declared for the Pythons that lack
tomllib.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from functools import lru_cache
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as normalise

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pyproject.toml declares tomli there (dev extra)
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
OWN = frozenset({"peftbd", "jobs", "serve_apps", "tests"})
SIDE_ENVIRONMENTS = {  # files run by another environment's Python, and what that one installs
    Path("peftbd/peers/vllm_side.py"): frozenset({"vllm"}),  # scripts/install.sh --with-vllm
}
RUNTIME_DIRS = ("peftbd", "jobs", "serve_apps", "scripts")
TEST_DIRS = ("tests",)


def requirement_name(requirement: str) -> str:
    """'ray[serve]>=2.50,<3' -> 'ray' (normalised as PEP 503 compares names)."""
    return normalise(Requirement(requirement).name)


def declared(pyproject: Path = REPO / "pyproject.toml") -> tuple[frozenset[str], frozenset[str]]:
    """(runtime, dev): the normalised distribution names [project].dependencies and the `dev`
    extra declare."""
    project = tomllib.loads(pyproject.read_text())["project"]
    runtime = frozenset(map(requirement_name, project.get("dependencies", [])))
    dev = frozenset(map(requirement_name, project.get("optional-dependencies", {}).get("dev", [])))
    return runtime, dev


def third_party_imports(source: str | bytes, filename: str = "<source>") -> list[tuple[str, int]]:
    """[(top-level module, line)] of every absolute import in `source` of neither the standard
    library nor this project."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in OWN:
                found.append((top, node.lineno))
    return sorted(set(found), key=lambda t: (t[1], t[0]))


@lru_cache(maxsize=1)
def _import_to_distributions() -> Mapping[str, list[str]]:
    return packages_distributions()


def distributions_of(module: str) -> set[str]:
    """The normalised names of the installed distributions that provide top-level `module`, or
    {the module's own name} when none is installed (then it can only be declared under it)."""
    return {normalise(d) for d in _import_to_distributions().get(module, [])} or {normalise(module)}


def undeclared(files: Iterable[Path], allowed: frozenset[str], where: str,
               root: Path = REPO) -> list[str]:
    """One message per import in `files` whose distribution is not in `allowed`, naming the file,
    the import and the line of pyproject.toml to add (in `where`)."""
    problems = []
    for path in files:
        shown = path.relative_to(root) if path.is_relative_to(root) else path
        side = SIDE_ENVIRONMENTS.get(shown, frozenset())
        for module, line in third_party_imports(path.read_bytes(), str(path)):
            dists = distributions_of(module)
            if dists & allowed or module in side:
                continue
            dist = sorted(dists)[0]
            problems.append(f"{shown}:{line} imports {module!r} (distribution {dist!r}), which "
                            f"pyproject.toml does not declare: add \"{dist}\" (with a version "
                            f"bound) to {where}")
    return problems


def python_files(dirs: Iterable[str], root: Path = REPO) -> list[Path]:
    return sorted(p for d in dirs for p in (root / d).rglob("*.py") if "__pycache__" not in p.parts)


def test_every_third_party_import_is_declared_in_pyproject():
    runtime, dev = declared()
    code, tests = python_files(RUNTIME_DIRS), python_files(TEST_DIRS)
    assert len(code) > 50 and len(tests) > 20, "the scan must see the project's files"
    problems = (undeclared(code, runtime, "[project].dependencies")
                + undeclared(tests, runtime | dev, "[project.optional-dependencies].dev"))
    assert not problems, "undeclared third-party imports:\n  " + "\n  ".join(problems)


def test_the_check_catches_undeclared_imports(tmp_path):
    """The check is not vacuous: an import of an uninstalled package, of an installed one that
    is declared only for the tests, and one declared nowhere (pytest's pluggy) all fail it; the
    standard library, this project and relative imports never do."""
    runtime, dev = declared()
    source = tmp_path / "probe.py"
    source.write_text(
        "import os, json\n"
        "from peftbd import stage\n"
        "from . import sibling\n"
        "import yaml\n"
        "import some_undeclared_pkg_xyz.sub\n"
        "from pytest import fixture\n"
        "import pluggy\n"
    )
    assert [m for m, _ in third_party_imports(source.read_text())] == [
        "yaml", "some_undeclared_pkg_xyz", "pytest", "pluggy"]
    assert distributions_of("yaml") == {"pyyaml"}  # the import name is not the distribution's

    as_code = undeclared([source], runtime, "[project].dependencies", root=tmp_path)
    assert [p.split(" ", 2)[:2] for p in as_code] == [
        ["probe.py:5", "imports"], ["probe.py:6", "imports"], ["probe.py:7", "imports"]]
    assert "'some_undeclared_pkg_xyz'" in as_code[0] and 'add "some-undeclared-pkg-xyz"' in as_code[0]
    assert "'pytest'" in as_code[1] and "[project].dependencies" in as_code[1]
    assert "'pluggy'" in as_code[2]

    as_test = undeclared([source], runtime | dev, "the dev extra", root=tmp_path)
    assert len(as_test) == 2 and "pytest" not in " ".join(as_test)

    without_hypothesis = (runtime | dev) - {"hypothesis"}
    fuzz = tmp_path / "test_fuzz.py"
    fuzz.write_text("from hypothesis import given\n")
    assert undeclared([fuzz], without_hypothesis, "the dev extra", root=tmp_path)
    assert not undeclared([fuzz], runtime | dev, "the dev extra", root=tmp_path)


def test_requirement_names_are_normalised():
    assert requirement_name("ray[data,train,serve]>=2.50,<3") == "ray"
    assert requirement_name('tomli>=2; python_version < "3.11"') == "tomli"
    assert normalise("Typing.Extensions__x") == normalise("typing-extensions-x") == "typing-extensions-x"
