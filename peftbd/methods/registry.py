"""The registry of drafting methods: each is declared once (`Method`) and everything that trains,
benchmarks, costs, reports or serves drafters iterates it.

A method is one module that builds a `Method` and calls `register` (the built-in ones are
imported by `peftbd.methods`; another module joins with `register` too, e.g. a test's). Its names (arm id,
serving name, training kind) appear in its module and here only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from peftbd.config_sections import Config
from peftbd.decoding.drafter import Drafter
from peftbd.methods.arm import AR, ArmSpec
from peftbd.stage import StageSpec
from peftbd.training.distill_task import DistillTask
from peftbd.training.examples import SequenceBatch
from peftbd.training.recipe import TrainingRecipe
from peftbd.training.rounds import Drafts

Shipped = Literal["kv", "hidden", "features"]
"""What a split verifier replica ships a method's drafter each round (`peftbd.serving.features`):
every layer's KV, the final hidden states, or the feature layers the drafter reads."""


@dataclass(frozen=True)
class DraftContext:
    """What a method builds its draft modules and drafters from: the config, the plain verifier
    (eval, frozen, on its device), the tokenizer's mask and pad ids, and the artifact's draft
    vocabulary, most frequent first (None: not loaded)."""

    cfg: Config
    verifier: nn.Module
    mask_id: int
    pad_id: int
    draft_vocab: Sequence[int] | None = None

    @property
    def device(self) -> torch.device:
        return next(self.verifier.parameters()).device


def _plain_verifier(module: nn.Module, ctx: DraftContext) -> nn.Module:
    return ctx.verifier


def _no_activation(module: nn.Module, spec: ArmSpec) -> None:
    return None


@dataclass(frozen=True)
class Method:
    """A drafting method, declared once.

    Names: `id` (results.json's `method`, its main arm's id), `serving` (the OpenAI `model` of
    both Serve apps), `kind` (`python -m jobs.train_<kind>`, the training task), `label` and
    `what` (report and messages). Training: `section` (the config section whose `optim` trains
    it), `stages` (the main job's training stages; the first is `jobs.train_<kind>`'s),
    `stage_configs` (the config each of those stages trains with), `task` (the
    `DistillTask`), `export_subdir` (where the stage puts the weights). Drafting: `arms` (its
    benchmark arms), `positions` (draft positions per round), `load` (its draft module from a
    stage's output dir, or untrained and seeded when None), `drafter` (the engine `Drafter` of an
    arm over that module), `verifier` (the model that verifies for it; PEFT-BD: its own adapter's
    model), `wraps_verifier` (`load` wraps the verifier it is given: the benchmark gives it a copy
    of its own), `activate` (before an arm runs on a module shared by several arms), `profile`
    (untrained modules at the cost profile's architecture, by stage key) and `profile_arms` (the
    arms timed there; None: `arms`), `replay` (the drafter's drafts of a batch's replayed rounds
    with the most tokens a round proposes, `peftbd.training.rounds`; None: no offline estimate).
    Serving: `dir_arg` (the Serve
    app argument naming its trained output dir), `ships` (what a split verifier ships it) and
    `feature_layers` (required when `ships` is "features": the verifier hidden states the drafter
    `load(ctx, path)` builds would read, from its saved config or the section, building nothing).
    """

    id: str
    serving: str
    kind: str
    label: str
    what: str
    section: str
    stages: tuple[StageSpec, ...]
    task: Callable[[Config], DistillTask]
    export_subdir: str
    arms: Callable[[Config], list[ArmSpec]]
    positions: Callable[[Config], int]
    load: Callable[[DraftContext, Path | None], nn.Module]
    drafter: Callable[[nn.Module, DraftContext, ArmSpec], Drafter]
    profile: Callable[[DraftContext], dict[str, nn.Module]]
    dir_arg: str
    ships: Shipped | None = None
    verifier: Callable[[nn.Module, DraftContext], nn.Module] = _plain_verifier
    wraps_verifier: bool = False
    activate: Callable[[nn.Module, ArmSpec], None] = _no_activation
    stage_configs: Callable[[Config], list[tuple[StageSpec, Config]]] | None = None
    profile_arms: Callable[[Config], list[ArmSpec]] | None = None
    replay: Callable[[Drafter, DraftContext, SequenceBatch], tuple[Drafts, int] | None] | None = None
    feature_layers: Callable[[DraftContext, Path | None], tuple[int, ...]] | None = None

    @property
    def recipe(self) -> TrainingRecipe:
        """What the training job needs of this method (`peftbd.training.recipe`)."""
        return TrainingRecipe(self.kind, self.what, self.section, self.stages, self.task,
                              self.stage_configs)

    @property
    def stage(self) -> StageSpec:
        """The stage `jobs.train_<kind>` runs (the method's main training stage)."""
        return self.stages[0]

    def cost_arms(self, cfg: Config) -> list[ArmSpec]:
        """The arms the cost profile times (`profile_arms`, else `arms`)."""
        return (self.profile_arms or self.arms)(cfg)

    def training_stages(self, cfg: Config) -> list[tuple[StageSpec, Config]]:
        """The training stages `cfg` asks of the main job, each with the config it trains with."""
        return self.recipe.training_stages(cfg)


_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add `method` (its id, serving name, kind, stages and Serve argument must be new; one that
    ships features must declare `feature_layers`; registering the same declaration twice is a
    no-op). Returns it."""
    if method.ships == "features" and method.feature_layers is None:
        raise ValueError(f"method {method.id!r} ships features but sets no Method.feature_layers: "
                         "give it (DraftContext, output dir or None) -> the verifier hidden-state "
                         "indices its drafter reads, which a split verifier keeps")
    if _REGISTRY.get(method.id) is method:
        return method
    for other in _REGISTRY.values():
        clash = [what for what, a, b in (
            ("id", method.id, other.id), ("serving name", method.serving, other.serving),
            ("training kind", method.kind, other.kind), ("Serve argument", method.dir_arg, other.dir_arg),
        ) if a == b] + [f"stage {s.name}" for s in method.stages if s.name in {t.name for t in other.stages}]
        if clash or method.serving == AR or method.id == AR:
            raise ValueError(f"method {method.id!r}: its {', '.join(clash) or 'name'} is taken by "
                             f"{other.id if clash else 'greedy AR'}; choose another")
    _REGISTRY[method.id] = method
    return method


def unregister(method_id: str) -> None:
    """Remove a method (tests that register one of their own)."""
    _REGISTRY.pop(method_id, None)


def methods() -> tuple[Method, ...]:
    """Every registered method, in registration order (the report's order)."""
    return tuple(_REGISTRY.values())


def method(method_id: str) -> Method:
    """The method with id `method_id`; an unknown one names those registered."""
    if method_id not in _REGISTRY:
        raise ValueError(f"no drafting method {method_id!r} is registered; registered: "
                         f"{', '.join(_REGISTRY) or 'none'}")
    return _REGISTRY[method_id]


def _find(what: str, value: str, key: Callable[[Method], str]) -> Method:
    for m in _REGISTRY.values():
        if key(m) == value:
            return m
    raise ValueError(f"no drafting method has the {what} {value!r}; registered: "
                     f"{', '.join(key(m) for m in _REGISTRY.values()) or 'none'}")


def by_serving(name: str) -> Method:
    """The method served as `name` (e.g. "peft-bd")."""
    return _find("serving name", name, lambda m: m.serving)


def by_kind(kind: str) -> Method:
    """The method `python -m jobs.train_<kind>` trains."""
    return _find("training kind", kind, lambda m: m.kind)


def serving_names() -> tuple[str, ...]:
    """What both Serve apps can serve: greedy AR, then every method's serving name."""
    return (AR, *(m.serving for m in _REGISTRY.values()))

