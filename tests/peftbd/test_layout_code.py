"""The stage contract's code half: every project module a stage's code imports is fingerprinted,
by the stage itself (`StageSpec.code`) or by a stage upstream of it (whose rerun reruns it), so
editing it can never leave that stage's output standing as current."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from peftbd.layout import ENGINE_SPEED, benchmark_stage, peer_stage, placement_stage, stages
from peftbd.stage import StageSpec, module_files

PROJECT = ("peftbd", "jobs", "serve_apps")
NOT_OUTPUT = {  # what these decide is not a stage's output
    "peftbd": "the package root",
    "peftbd.cli": "command-line parsing",
    "peftbd.config": "the config tree: the values a stage reads are fingerprinted themselves",
    "peftbd.config_sections": "the config tree's sections (as above)",
    "peftbd.config_serving": "the config tree's serving section (as above)",
    "peftbd.layout": "the stage declarations",
    "peftbd.method_catalog": "which methods are registered (each method's code is fingerprinted)",
    "peftbd.process_setup": "imports the config's plugins and runs the world stage (its own)",
    "peftbd.tiny_world.location": "where the world stage put the world (its content is an input)",
    "peftbd.stage": "the stage contract",
    "peftbd.manifest": "where manifests, wall time and peak memory are written",
    "peftbd.progress": "progress reports",
    "peftbd.untrained": "which settings are refused",
    "peftbd.errors": "the user-error base class: which errors print as one line",
    "jobs.progress": "progress relays",
    "jobs.ray_env": "starting Ray",
    "jobs.resources": "waiting for Ray resources",
    "jobs.train_failures": "which worker errors are retried",
    "peftbd.tiny_world.shipped": "copies in the world the recipe built for this very fingerprint",
}
LOCATED_NOT_FINGERPRINTED = {  # per stage: code whose effect reaches the stage as a fingerprinted value
    # the architecture it profiles is an input (its config, origin and weights: jobs.cost_profile);
    # peftbd.models.loading's world and chat imports only locate the run's verifier
    "cost_profile": {"peftbd.tiny_world.build", "peftbd.tiny_world.tokenizer", "peftbd.data.chat"},
}


def _covers(code: tuple[str, ...], module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in code)


def _imports(module: str) -> set[str]:
    """The project modules imported by the files of `module` that its code hash covers."""
    found: set[str] = set()
    for path in (p for p in module_files(module) if p.suffix == ".py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
    return {m for m in found if m.split(".")[0] in PROJECT}


def _fingerprinted(spec: StageSpec) -> tuple[str, ...]:
    """The code of `spec` and of every stage upstream of it."""
    return tuple(dict.fromkeys([*spec.code, *(c for up in spec.inputs for c in _fingerprinted(up))]))


def _unfingerprinted(spec: StageSpec) -> dict[str, str]:
    """Project modules that `spec`'s code reaches and no fingerprint covers -> who imports them."""
    covered, allowed = _fingerprinted(spec), LOCATED_NOT_FINGERPRINTED.get(spec.name, set())
    todo, seen, missing = list(spec.code), set(), {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imports(module):
            if _covers(spec.code, name):
                todo.append(name)
            elif not _covers(covered, name) and name not in NOT_OUTPUT and name not in allowed:
                missing[name] = module
    return missing


@pytest.mark.parametrize("spec", [*stages(), ENGINE_SPEED, placement_stage(), peer_stage()], ids=lambda s: s.name)
def test_every_module_a_stage_imports_is_fingerprinted(spec):
    assert _unfingerprinted(spec) == {}, f"add these to {spec.name}'s StageSpec.code (peftbd.layout)"


def test_the_check_sees_a_module_left_out():
    """Without `peftbd.cost_model` in its code, the benchmark's report could go stale: seen."""
    bench = benchmark_stage()
    cut = dataclasses.replace(bench, code=tuple(c for c in bench.code if c != "peftbd.cost_model"))
    assert "peftbd.cost_model" in _unfingerprinted(cut)
