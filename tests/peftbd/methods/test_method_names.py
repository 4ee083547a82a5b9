"""A drafting method's names are spelled in its own module only (`peftbd.methods.registry`): no
other file of the library, the jobs or the Serve apps may hold one as a string literal, so a
renamed or newly registered method needs no edit elsewhere.

A method's names: its id (also its config section and serving name), its arm ids (at PRESETS),
its training stages' names and output dirs, and its Serve argument. A literal is a string
constant, an f-string's constant parts included; docstrings (a string constant as a bare
statement) are prose and not checked.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

from peftbd.analysis.paper import PAPER_VALUES
from peftbd.config import Config, load_config
from peftbd.methods import AR, Method, methods

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("peftbd", "jobs", "serve_apps")
PRESETS = ("tiny", "tiny-full")  # tiny-full: tiny with the ablations' arms too

ALLOWED: dict[str, set[str]] = {
    # two experiments about named methods: the engine speed check times PEFT-BD (its section is
    # the check's input) and the DFlash recipe ablation compares DFlash with the head it reverts to
    "peftbd/layout.py": {"peftbd", "peftbd_head", "dflash"},
    # the paper's published values, keyed by the paper's arm names (test_paper_arms_are_our_arms)
    "peftbd/analysis/paper.py": {"peftbd", "fastmtp", "peftbd_2step", "peftbd_anchored"},
    # the Python package's name (importlib.resources), not PEFT-BD's id
    "peftbd/presets.py": {"peftbd"},
    # the OpenAI model card's `owned_by`: the project, not PEFT-BD
    "peftbd/serving/schemas.py": {"peftbd"},
    # speed.json's key of the speed check's own PEFT-BD run (an experiment's format, no arm)
    "peftbd/benchmarking/engine_speed.py": {"peftbd"},
    # vLLM's name of its DFlash proposer (its speculative_config's method), not ours
    "peftbd/peers/vllm_side.py": {"dflash"},
    # the placement projection: the paper's tokens per round of its drafters and the one that
    # drafts ahead; each drafter's forwards counted at the GPU roofline (issue 66 moves these
    # into each method's folder)
    "peftbd/simulation/study.py": {"peftbd", "fastmtp", "peftbd_head"},
    "peftbd/simulation/roofline_cost.py": {"peftbd", "fastmtp", "peftbd_head", "dflash", "prompt_lookup"},
}
"""File -> names of a method it may spell, each for the reason above it."""


@cache
def configs() -> tuple[Config, ...]:
    return tuple(load_config(p) for p in PRESETS)


def section_names() -> set[str]:
    return {f.name for f in dataclasses.fields(Config)}


def names(m: Method) -> set[str]:
    """The names of `m` no other file may spell (module doc)."""
    arms = {a.id for cfg in configs() for a in m.arms(cfg)}
    stages = {n for s in m.stages for n in (s.name, s.subdir)}
    return {m.id, m.serving, m.dir_arg, *stages, *arms}


def own_module(m: Method) -> str:
    """The repository path of the module that declares `m` (its `METHOD`)."""
    found = [Path(file) for mod in list(sys.modules.values())  # a job importing it is no declarer
             if getattr(mod, "METHOD", None) is m and (file := getattr(mod, "__file__", None))
             and getattr(mod, "__name__", "").startswith("peftbd.methods.")]
    assert len(found) == 1, f"method {m.id!r}: {len(found)} modules declare it as METHOD"
    return found[0].resolve().relative_to(ROOT).as_posix()


@cache
def literals(path: Path) -> tuple[tuple[int, str], ...]:
    """(line, value) of every string literal in `path` but its docstrings."""
    tree = ast.parse(path.read_text(), str(path))
    prose = {id(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return tuple((node.lineno, node.value) for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)
                 and id(node) not in prose)


def sources() -> Iterator[tuple[str, Path]]:
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path


def offenders(m: Method) -> list[str]:
    """`file:line: name` for every literal spelling one of `m`'s names where it may not."""
    mine, exempt = names(m), {own_module(m), "peftbd/methods/registry.py"}
    return [f"{rel}:{line}: {value!r}" for rel, path in sources() if rel not in exempt
            for line, value in sorted(set(literals(path)))
            if value in mine and value not in ALLOWED.get(rel, set())]


@pytest.mark.parametrize("m", methods(), ids=lambda m: m.id)
def test_a_methods_names_are_spelled_in_its_own_module_only(m: Method) -> None:
    if found := offenders(m):
        pytest.fail(f"{m.label}'s names spelled outside {own_module(m)} (use its module's "
                    "constants or the registry):\n" + "\n".join(found), pytrace=False)


def test_the_allowlist_names_names_of_methods() -> None:
    """Every allowed name still belongs to a registered method (else the entry is stale)."""
    every = set().union(*(names(m) for m in methods()))
    assert {n for allowed in ALLOWED.values() for n in allowed} <= every


def test_paper_arms_are_our_arms() -> None:
    """The paper's arm names (`peftbd.analysis.paper`) each name an arm of ours at PRESETS,
    where the paper table and the findings look for our number beside the paper's."""
    ours = {AR} | {a.id for cfg in configs() for m in methods() for a in m.arms(cfg)}
    assert {pv.arm for pv in PAPER_VALUES} <= ours


def test_literals_are_string_constants_and_f_string_parts_not_docstrings(tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text('"""Doc."""\nX = "a"\n"""X\'s doc."""\n\n\ndef f(k: int) -> str:\n'
                    '    """Doc."""\n    return f"b{k}c"\n')
    assert sorted(value for _, value in literals(path)) == ["a", "b", "c"]
