"""The acceptance study: what decides how many tokens a trained drafter gets accepted per round.

Each suspect is varied alone, the others fixed (`Variant`): the verifier's depth at about the
same parameter count (`depth`), each drafter's training budget (`budget`), and content, read per
category from every variant's rows (`peftbd.tiny_world.corpus.CATEGORIES`). A variant is a world
and its drafters trained by the main job's own stages under `--set` overrides; its acceptance is
the offline replay (`peftbd.benchmarking.replay.replay_rows`: the engine's greedy rounds, which
Table 6 of the report checks against the engine) of every drafter over the held-out val and
test rows at the artifact's own budget, per category, with a 95% interval over rows
(`peftbd.intervals`: the studentized bootstrap).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from peftbd.benchmarking.arms import DrafterDirs, arm_specs, load_arm_models
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.replay import RowReplay, replay_rows
from peftbd.config import Config, ConfigError
from peftbd.data.artifact import read_split
from peftbd.intervals import ratio_interval
from peftbd.methods import Method

MIX = "mix"
"""The category name of all rows together (the default mix)."""


@dataclass(frozen=True)
class Variant:
    """One study variant: `overrides` (`--set` items) on the run's config, the `factor` it
    varies (base | depth | budget) and its `level` on that factor's axis (layers; budget
    multiple)."""

    name: str
    factor: str
    level: float
    overrides: tuple[str, ...] = ()


DEPTH_SHAPES = {
    4: ("tiny_world.hidden_size=128", "tiny_world.head_dim=32", "tiny_world.intermediate_size=640"),
    8: ("tiny_world.hidden_size=96", "tiny_world.head_dim=24", "tiny_world.intermediate_size=384"),
}
"""Verifier shapes of 4 and 8 layers with about the 2-layer default's non-embedding parameters
(hidden 192, MLP 768: 1.11M; these 1.18M and 1.11M), 4 heads and 2 KV heads each."""
DEPTH_STEPS_CAP = 2
"""A deeper world trains until its held-out loss reaches the base world's, for at most this
many times the base world's steps."""


def variants(cfg: Config, methods: Sequence[Method], depths: Sequence[int],
             budgets: Sequence[float], heldout_loss: float = 0.0) -> list[Variant]:
    """The base (the run's own config), one variant per other depth (`DEPTH_SHAPES`, trained to
    the base world's `heldout_loss` when > 0, within DEPTH_STEPS_CAP x its steps: equal recall)
    and one per budget multiple (every drafter's steps scaled)."""
    out = [Variant("base", "base", 1.0)]
    base_layers = cfg.tiny_world.num_layers
    for depth in depths:
        if depth == base_layers:
            continue
        if depth not in DEPTH_SHAPES:
            raise ConfigError(f"--depths {depth}: the study knows verifier shapes of "
                             f"{', '.join(map(str, [base_layers, *DEPTH_SHAPES]))} layers")
        recall = (f"tiny_world.heldout_loss_target={heldout_loss}",
                  f"tiny_world.train_steps={cfg.tiny_world.train_steps * DEPTH_STEPS_CAP}")
        out.append(Variant(f"depth{depth}", "depth", depth,
                           (f"tiny_world.num_layers={depth}", *DEPTH_SHAPES[depth],
                            *(recall if heldout_loss > 0 else ()))))
    for scale in budgets:
        if scale == 1:
            continue
        sets = []
        for m in methods:
            optim = getattr(cfg, m.section).optim
            steps = max(1, round(optim.max_steps * scale))
            sets += [f"{m.section}.optim.max_steps={steps}",
                     f"{m.section}.optim.eval_every={max(1, round(optim.eval_every * scale))}",
                     f"{m.section}.optim.checkpoint_every={max(1, round(optim.checkpoint_every * scale))}"]
        out.append(Variant(f"budget{scale:g}x", "budget", scale, tuple(sets)))
    return out


@dataclass(frozen=True)
class Cell:
    """One drafter arm on one category of one variant: rows, rounds, tokens per round (bonus
    included) with its 95% interval, and position-1 acceptance."""

    variant: str
    arm: str
    category: str
    rows: int
    rounds: int
    tokens_per_round: float
    ci95: tuple[float, float]  # one row: no width
    position1: float


def cell(variant: str, arm: str, category: str, rows: Sequence[RowReplay]) -> Cell:
    """The cell of `rows`' replays."""
    rounds = sum(r.rounds for r in rows)
    per_round = round(1 + sum(r.accepted for r in rows) / rounds, 4)
    # 1 + accepted / rounds: each row's emitted tokens (accepted + a bonus a round) / its rounds
    low, high = ratio_interval([r.accepted + r.rounds for r in rows],
                               [r.rounds for r in rows]) or (per_round, per_round)
    return Cell(variant, arm, category, len(rows), rounds, per_round,
                (round(low, 4), round(high, 4)),
                round(sum(r.first_accepted for r in rows) / rounds, 4))


def held_out(artifact_dir: str | Path) -> tuple[list[Prompt], list[list[int]]]:
    """The artifact's val and test rows as prompts (with their categories) and references."""
    prompts, references = [], []
    for split in ("val", "test"):
        for row in read_split(artifact_dir, split).to_pylist():
            prompts.append(Prompt(row["id"], row["prompt_ids"], row["category"] or MIX))
            references.append(row["continuation_ids"])
    return prompts, references


def replay_cells(cfg: Config, variant: str, artifact_dir: str | Path,
                 dirs: DrafterDirs) -> list[Cell]:
    """Every non-synthetic drafter arm whose training stage is in `dirs`, replayed on the
    artifact's held-out rows at `data.max_new_tokens`: a cell per category and one for the
    whole mix."""
    models = load_arm_models(cfg, dirs)
    prompts, references = held_out(artifact_dir)
    categories = [p.category or MIX for p in prompts]
    cats = sorted(set(categories) - {MIX})
    cells = []
    for spec in arm_specs(cfg):
        if spec.stage not in dirs.stages or spec.synthetic:
            continue
        rows = replay_rows(models, spec, prompts, references, cfg.data.max_new_tokens)
        if rows is None:
            continue
        cells.append(cell(variant, spec.id, MIX, rows))
        cells += [cell(variant, spec.id, c, [r for r, rc in zip(rows, categories) if rc == c])
                  for c in cats]
    return cells


@dataclass(frozen=True)
class VariantFacts:
    """What a variant trained: its verifier (layers, parameters, steps, held-out loss in nats
    per token on phrasings it was not taught) and each drafter stage's optimizer steps."""

    variant: Variant
    layers: int
    hidden_size: int
    parameters: int
    world_steps: int
    heldout_loss: float
    drafter_steps: dict[str, int]


@dataclass(frozen=True)
class Study:
    """The study's output (study.json): every variant's facts and replayed cells."""

    variants: list[VariantFacts]
    cells: list[Cell]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Study:
        raw = json.loads(text)
        facts = [VariantFacts(**{**f, "variant": Variant(**{**f["variant"], "overrides": tuple(
            f["variant"]["overrides"])})}) for f in raw["variants"]]
        cells = [Cell(**{**c, "ci95": tuple(c["ci95"])}) for c in raw["cells"]]
        return cls(facts, cells)

    def get(self, variant: str, arm: str, category: str = MIX) -> Cell | None:
        return next((c for c in self.cells
                     if (c.variant, c.arm, c.category) == (variant, arm, category)), None)
