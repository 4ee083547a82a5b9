"""The registry of drafting methods: each is declared once (`Method`) and everything that trains,
benchmarks, costs, reports or serves drafters iterates it.

A method is one module that builds a `Method` and calls `register` (the built-in ones are
imported by `peftbd.methods`; any other module joins through `methods.plugins` in the config).
It has one name, its id: its config section, its serving name (the OpenAI `model` suffix), its
training stage `train_<id>` (`peftbd.layout.training_stage`), output dir `<id>`, Serve argument
`<id>_dir` and `python -m jobs.train --method <id>` all derive from it. A name it went by before
(`Former`) is refused with a one-line "renamed to".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

import torch
from torch import nn

from peftbd.config_sections import Config
from peftbd.method_catalog import _ENTRIES, Former, renamed
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


def defaults_beside(module_file: str, method_id: str) -> dict[str, Any]:
    """A method's section values from the YAML file beside its module (`<module>.yaml`, keyed by
    its id, commented as a preset is)."""
    path = Path(module_file).with_suffix(".yaml")
    return dict(yaml.safe_load(path.read_text())[method_id])


def _no_module(ctx: DraftContext, path: Path | None) -> nn.Module:
    return nn.Module()


@dataclass(frozen=True)
class Method:
    """A drafting method, declared once.

    Name: `id`, from which every other name derives (the properties `section`, `serving`,
    `dir_arg`; stages by `peftbd.layout.training_stage`); `label` and `what` (report and
    messages); `former` (names refused as renamed). Config: `config` (its section's frozen
    dataclass, at `cfg.<id>`) and `defaults` (the section's values; a preset, file or --set
    changes any). Training (none for a model-free method: `task` None, `stages` ()): `stages`
    (its training stages; the first is `jobs.train --method <id>`'s), `stage_configs` (the config
    each of those stages trains with), `task` (the `DistillTask`), `export_subdir` (where the
    stage puts the weights). Drafting: `arms` (its benchmark arms), `positions` (draft positions
    per round), `load` (its draft module from a stage's output dir, or untrained and seeded when
    None; a model-free method's, an empty module), `drafter` (the engine `Drafter` of an arm over
    that module), `verifier` (the model that verifies for it; PEFT-BD: its own adapter's model),
    `wraps_verifier` (`load` wraps the verifier it is given: the benchmark gives it a copy of its
    own), `activate` (before an arm runs on a module shared by several arms), `profile`
    (untrained modules at the cost profile's architecture, by stage key; default: its `load`
    untrained, keyed by its id) and `profile_arms` (the arms timed there; None: `arms`), `replay`
    (the drafter's drafts of a batch's replayed rounds with the most tokens a round proposes,
    `peftbd.training.rounds`; None: no offline estimate), `draft_vocab` (how many of the
    artifact's most frequent tokens its arms draft over: `DraftContext.draft_vocab`), `cost_reads`
    (the keys of its section its cost profile reads; None: all but `optim`), `profile_section`
    (its section as the cost profile runs it, given the profiled vocabulary size; None: as
    configured). Serving: `ships` (what a split verifier
    ships it; None: nothing, it reads only tokens) and `feature_layers` (required when `ships` is
    "features": the verifier hidden states the drafter `load(ctx, path)` builds would read, from
    its saved config or the section, building nothing).
    """

    id: str
    label: str
    what: str
    config: type
    defaults: Mapping[str, Any]
    arms: Callable[[Config], list[ArmSpec]]
    positions: Callable[[Config], int]
    drafter: Callable[[nn.Module, DraftContext, ArmSpec], Drafter]
    load: Callable[[DraftContext, Path | None], nn.Module] = _no_module
    stages: tuple[StageSpec, ...] = ()
    task: Callable[[Config], DistillTask] | None = None
    export_subdir: str = ""
    profile: Callable[[DraftContext], dict[str, nn.Module]] | None = None
    ships: Shipped | None = None
    verifier: Callable[[nn.Module, DraftContext], nn.Module] = _plain_verifier
    wraps_verifier: bool = False
    activate: Callable[[nn.Module, ArmSpec], None] = _no_activation
    stage_configs: Callable[[Config], list[tuple[StageSpec, Config]]] | None = None
    profile_arms: Callable[[Config], list[ArmSpec]] | None = None
    replay: Callable[[Drafter, DraftContext, SequenceBatch], tuple[Drafts, int] | None] | None = None
    feature_layers: Callable[[DraftContext, Path | None], tuple[int, ...]] | None = None
    draft_vocab: Callable[[Config], int] | None = None
    cost_reads: tuple[str, ...] | None = None
    profile_section: Callable[[Config, int | None], Any] | None = None
    former: Former = field(default_factory=Former)

    @property
    def section(self) -> str:
        """Its config section: `cfg.<id>`."""
        return self.id

    @property
    def serving(self) -> str:
        """What both Serve apps serve it as (the OpenAI `model` suffix): its id."""
        return self.id

    @property
    def dir_arg(self) -> str:
        """The Serve apps' and placement's argument naming its trained output dir."""
        return f"{self.id}_dir"

    @property
    def trains(self) -> bool:
        """Whether it has a training stage (a model-free method has none)."""
        return self.task is not None  # `register`: a task comes with its stages

    @property
    def recipe(self) -> TrainingRecipe:
        """What the training job needs of this method (`peftbd.training.recipe`)."""
        if self.task is None:
            raise ValueError(f"method {self.id!r} has nothing to train (no task, no stage)")
        return TrainingRecipe(self.id, self.what, self.id, self.stages, self.task, self.stage_configs)

    @property
    def stage(self) -> StageSpec | None:
        """The stage `jobs.train --method <id>` runs (its main training stage; None: none)."""
        return self.stages[0] if self.stages else None

    def module_key(self, spec: ArmSpec) -> str:
        """Where an arm's draft module is kept: its training stage's name, else the method id."""
        return spec.stage or self.id

    def cost_arms(self, cfg: Config) -> list[ArmSpec]:
        """The arms the cost profile times (`profile_arms`, else `arms`)."""
        return (self.profile_arms or self.arms)(cfg)

    def cost_modules(self, ctx: DraftContext) -> dict[str, nn.Module]:
        """Its untrained modules at the cost profile's architecture (`profile`, else `load`'s
        untrained module under its main stage's name, or its id)."""
        if self.profile is not None:
            return self.profile(ctx)
        return {self.stage.name if self.stage else self.id: self.load(ctx, None)}

    def training_stages(self, cfg: Config) -> list[tuple[StageSpec, Config]]:
        """The training stages `cfg` asks of the main job, each with the config it trains with."""
        return self.recipe.training_stages(cfg) if self.trains else []


_REGISTRY = _ENTRIES  # every registered Method, by id (peftbd.method_catalog)


def register(method: Method) -> Method:
    """Add `method` (its id must be new and a valid section name; one that ships features must
    declare `feature_layers`; registering the same declaration twice is a no-op). Returns it."""
    if not method.id.isidentifier() or method.id != method.id.lower():
        raise ValueError(f"method id {method.id!r}: use lower_snake_case (it names a config "
                         "section, a stage and a Serve argument)")
    if method.ships == "features" and method.feature_layers is None:
        raise ValueError(f"method {method.id!r} ships features but sets no Method.feature_layers: "
                         "give it (DraftContext, output dir or None) -> the verifier hidden-state "
                         "indices its drafter reads, which a split verifier keeps")
    if (method.task is None) != (not method.stages):
        raise ValueError(f"method {method.id!r}: give both a training task and its stages "
                         "(peftbd.layout.training_stage), or neither (a model-free method)")
    if _REGISTRY.get(method.id) is method:
        return method
    taken = {AR, *_REGISTRY, *(s.name for m in _REGISTRY.values() for s in m.stages)}
    clash = [n for n in (method.id, *(s.name for s in method.stages)) if n in taken]
    if clash or method.id in {n for m in _REGISTRY.values() for n in (m.former.section, m.former.serving)}:
        raise ValueError(f"method {method.id!r}: the name {(clash or [method.id])[0]!r} is taken; "
                         "choose another id")
    _REGISTRY[method.id] = method
    return method


def unregister(method_id: str) -> None:
    """Remove a method (tests that register one of their own)."""
    _REGISTRY.pop(method_id, None)


def methods() -> tuple[Method, ...]:
    """Every registered method, in registration order (the report's order)."""
    return tuple(_REGISTRY.values())


__all__ = ["DraftContext", "Former", "Method", "Shipped", "by_serving", "defaults_beside", "method",
           "methods", "register", "renamed", "serving_names", "unregister"]


def method(method_id: str) -> Method:
    """The method with id `method_id`; an unknown one names those registered (or its new name)."""
    if method_id not in _REGISTRY:
        new = renamed(method_id) if method_id else None
        if new is not None:
            raise ValueError(f"drafting method {method_id!r} was renamed to {new!r}")
        raise ValueError(f"no drafting method {method_id!r} is registered; registered: "
                         f"{', '.join(_REGISTRY) or 'none'} (another needs its module in methods.plugins)")
    return _REGISTRY[method_id]


by_serving = method
"""The method served as `name` (its id)."""


def serving_names() -> tuple[str, ...]:
    """What both Serve apps can serve: greedy AR, then every method's id."""
    return (AR, *_REGISTRY)
