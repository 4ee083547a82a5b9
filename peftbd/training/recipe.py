"""What the training job needs of a drafting method (`TrainingRecipe`): its id, task, config
section, stages and the config each stage trains with. A method's declaration
(`peftbd.methods.Method.recipe`) hands it over, so training depends on no other part of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from peftbd.config_sections import Config
from peftbd.stage import StageSpec
from peftbd.training.distill_task import DistillTask


@dataclass(frozen=True)
class TrainingRecipe:
    """`kind` (the method id: `python -m jobs.train --method <kind>`), `what` (messages),
    `section` (the config section whose `optim` trains it), `stages` (the first is that job's),
    `task`, and
    `stage_configs` (each stage's config; None: the first stage with the run's config)."""

    kind: str
    what: str
    section: str
    stages: tuple[StageSpec, ...]
    task: Callable[[Config], DistillTask]
    stage_configs: Callable[[Config], list[tuple[StageSpec, Config]]] | None = None

    @property
    def stage(self) -> StageSpec:
        """The stage `jobs.train --method <kind>` runs (the method's main training stage)."""
        return self.stages[0]

    def training_stages(self, cfg: Config) -> list[tuple[StageSpec, Config]]:
        """The training stages `cfg` asks of the main job, each with the config it trains with."""
        return self.stage_configs(cfg) if self.stage_configs else [(self.stage, cfg)]
