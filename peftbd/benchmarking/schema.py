"""The benchmark's `results.json`: its types, which the writer (`peftbd.benchmarking.results`)
and every reader (`peftbd.analysis`, the jobs) share, and small accessors.

`Results` is the file: `Results.read(path)` checks a file's schema version and shape (naming the
first key that does not fit and the fix), `results.write(path)` writes it. Throughput is output
tokens over the summed per-prompt decode time (batch 1, prompts timed one after another), so it
does not depend on how many workers shared the prompts. `per_position` is the engine's
(`peftbd.decoding.metrics`): rate = accepted / proposed, conditional = accepted / reached =
P(accept j | accepted j - 1).

`sampling` (`peftbd.benchmarking.sampled`): per arm and temperature, the engine's run metrics
over the sampled prompts: at T > 0 of one sampled batch-1 pass (check: every output a valid sample,
within budget, ending on EOS or at the budget; losslessness is the statistical tests', not an
audit's); at T = 0 of the greedy batch-1 pass on the same prompts.

`concurrency` is the batch sweep (`peftbd.benchmarking.concurrency`): aggregate throughput with
at most B requests decoding at once = generated tokens / wall time of the whole pass over the
prompts (median over repeats; at B > 1 over the first `timing.sweep_repeats`), so unlike the
arms' per-prompt tok/s it counts rows in parallel.

Acceptance carries its own interval (version 4): tokens per round (the engine's `mean_accepted`,
bonus included, the prompts pooled) with its 95% interval over the prompts (`noise`) per
speculative arm and per category, beside each category's position-1 acceptance and rounds, and
per arm the categories' equal-weight mix; the std over repeats (0 for one or greedy repeats)
says nothing about how far acceptance would move on other prompts. Version 3 files are refused.
Fields added since (`Arm.stage`, `.floor`, `.mix_accepted*`, `MeasuredOn.floor`) keep defaults.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from peftbd.benchmarking.cost_profile_schema import CostProfile, DeviceFloor
from peftbd.benchmarking.misfit import misfit
from peftbd.decoding.audit import Mismatch
from peftbd.errors import UserError
from peftbd.methods.arm import AR
from peftbd.methods.fastmtp import ID as FASTMTP

SCHEMA = "peftbd-benchmark/4"

ORACLE_TARGETS: tuple[str, ...] = (FASTMTP, AR)
"""Arms whose measured throughput the draft-cost oracle asks each speculative arm to match (the
paper's: FastMTP and greedy AR)."""

Interval = tuple[float, float]
"""A 95% interval over the prompts (`peftbd.intervals`, studentized bootstrap): (low, high)."""


class Record(BaseModel):
    """A part of results.json: every key declared, none unknown."""

    model_config = ConfigDict(extra="forbid")


class Stat(Record):
    """Mean and sample standard deviation over the repeated runs."""

    mean: float
    std: float


class Throughput(Stat):
    """An arm's tok/s over the repeats, with its interval over the prompts (None: under 2)."""

    ci95: Interval | None = None


class Speedup(Record):
    """tok/s over AR's, paired by prompt."""

    mean: float
    ci95: Interval | None


class MeasuredOn(Record):
    model: str
    engine: str
    hardware: str
    device: str
    dtype: str
    floor: DeviceFloor | None = None  # the device's floor at that dtype (None: not measured)


class PromptsInfo(Record):
    source: str  # "test" | "spec-bench"
    path: str
    count: int
    max_new_tokens: int
    categories: dict[str, int] | None
    dropped: dict[str, int]  # {reason: prompts dropped}


class Timing(Record):
    workers: int
    torch_threads: int
    repeats: int
    worker_num_cpus: float
    worker_num_gpus: float
    batch_sizes: list[int]  # decoding.batch_sizes
    sweep_repeats: int  # the first repeats, those with the passes at B > 1
    sweep_variants: bool = True  # decoding.sweep_variants: the variant arms in those passes too
    how: str
    per_worker_hardware: list[str]
    per_worker_peak_rss_mib: list[float]


class DrafterInfo(BaseModel):
    """A training stage's output the arms read: its path and its training manifest (config,
    versions and contract left out; whatever else the training job records is kept)."""

    model_config = ConfigDict(extra="allow")

    path: str
    untrained: bool = False
    untrained_reasons: list[str] = Field(default_factory=list)
    metrics: dict[str, Any] = Field(default_factory=dict)
    draft_vocab: dict[str, Any] | None = None  # the head's draft vocabulary: size, coverage


class Repeat(Record):
    """One repeated run of every prompt."""

    tokens_per_s: float
    new_tokens: int
    decode_s: float
    rounds: int
    mean_accepted: float


class Replay(Record):
    """The engine's rounds replayed offline on these prompts + AR's outputs (one-step drafters)."""

    rounds: int
    proposed: int
    accepted: int
    mean_accepted_prefix: float | None
    token_acceptance: float | None


class PerPosition(Record):
    """Index j - 1 for draft position j = 1..D, over every repeat."""

    proposed: list[int]
    reached: list[int]
    accepted: list[int]
    rate: list[float | None]
    conditional: list[float | None]


class Calls(Record):
    calls: int
    mean_ms: float | None


class Forward(Record):
    """Draft and verify forward calls per run (one repeat) and their mean latency."""

    draft: Calls
    verify: Calls


class Round(Record):
    """ms: mean per round; shares of the round time."""

    t0_s: float
    draft_ms: float
    verify_ms: float
    draft_share: float
    verify_share: float
    other_share: float


class Audit(Record):
    prompts: int
    exact: int
    exact_pct: float | None
    mismatches: list[Mismatch]


class Reference(Record):
    """AR's greedy outputs against another engine's (`peftbd.benchmarking.references`): on
    `checked` prompts, `identical` of them token for token, each other one's first difference
    with the verifier's top-2 margin there; `absent`: why the engine did not run."""

    engine: str
    checked: int
    identical: int
    mismatches: list[Mismatch]
    absent: str | None = None
    version: str = ""


class Reduction(Record):
    r: float
    t_s: float
    tokens_per_s: float


class Oracle(Record):
    """`peftbd.cost_model.draft_cost_oracle`'s output."""

    t0_s: float
    draft_share: float
    accepted: float
    reductions: list[Reduction]
    needed_accepted: dict[str, float]  # {target arm: tokens per round}


class CategoryStats(Record):
    """One arm on the prompts of one category (Spec-Bench's, or the world's own)."""

    prompts: int
    tokens_per_s: Stat
    mean_accepted: Stat  # tokens per round (bonus included), over the repeats
    mean_accepted_ci95: Interval | None  # its interval over the prompts (None: AR, under 2 prompts)
    position1_acceptance: float | None  # rounds whose first draft token was accepted / rounds
    # that drafted (Table 4's rate at j = 1, `per_position.rate[0]`; None: AR, nothing drafted)
    rounds: int  # rounds decoded, over every repeat


class OverFloor(Record):
    """The arm's round against its floor on the device: measured / floor ("x over floor")."""

    draft_ms_round: float
    verify_ms_forward: float
    draft_x: float | None
    verify_x: float | None


class Arm(Record):
    """One arm: AR or a registered drafting method (`peftbd.methods`) with its settings."""

    label: str
    method: str  # "ar" | a method id
    stage: str | None = None  # the training stage whose output drafts (None: AR, or older files)
    settings: dict[str, Any]
    repeats: list[Repeat]
    tokens_per_s: Throughput
    mean_accepted: Stat  # tokens per round (bonus included), over the repeats
    mean_accepted_ci95: Interval | None  # its interval over the prompts (None: AR, under 2 prompts)
    mix_accepted: float | None = None  # the categories' tokens per round weighted equally (None:
    mix_accepted_ci95: Interval | None = None  # AR, no categories) and its interval over prompts
    speedup_vs_ar: Speedup | None
    mean_accepted_prefix: float | None  # accepted draft tokens / round, bonus excluded
    token_acceptance: float | None
    block_acceptance: float | None
    replay: Replay | None = None
    per_position: PerPosition
    forward: Forward
    round: Round
    audit: Audit | None  # None for AR, the reference
    oracle: Oracle | None  # speculative arms only
    by_category: dict[str, CategoryStats]
    floor: OverFloor | None = None
    paths: dict[str, str] = {}  # each round forward's path: "compiled" | "eager" (older: {})
    compile_s: float = 0.0  # fast path: seconds compiling its graphs, summed over the workers
    timed_compiles: int = 0  # fast path: graphs that compiled inside a timed pass (0: none)
    # fast path on CUDA: what the CUDA-graph trees did over its passes, summed over the workers
    # (None: not compiled on CUDA; `forward_paths.cuda_graph_fallbacks` reads them)
    cuda_graph_replays: int | None = None
    cuda_graph_skips: int | None = None

    @property
    def speculative(self) -> bool:
        """True for arms with a drafter (everything but greedy AR)."""
        return self.method != AR


class Check(Record):
    prompts: int
    valid: int
    invalid: list[str]  # prompt ids


class Sampled(Record):
    """One arm at one temperature: one pass's run metrics."""

    temperature: float
    tokens_per_s: float
    mean_accepted: float
    mean_accepted_prefix: float | None
    token_acceptance: float | None
    new_tokens: int
    decode_s: float
    rounds: int
    per_position: PerPosition
    check: Check | None  # None at T = 0


class SampledArm(Record):
    label: str
    skipped: str | None  # why not at T > 0
    by_temperature: list[Sampled]  # in `temperatures` order


class Sampling(Record):
    temperatures: list[float]  # decoding.temperatures
    seed: int  # decoding.sampling_seed
    prompts: int  # the first decoding.sampling_prompts
    how: str
    arms: dict[str, SampledArm]


@dataclass(frozen=True)
class ConcurrencyRow:
    """One arm at one batch size: aggregate tok/s (median over repeats), accepted tokens per
    round (bonus included), whether every output equals greedy AR's batch-1 output for its
    prompt, tok/s over AR's at the same batch size (None without AR), and the median repeat's
    wall seconds (summed over workers)."""

    arm: str
    batch_size: int
    tokens_per_s: float
    mean_accepted: float | None
    exact: bool
    speedup_vs_ar: float | None
    wall_s: float


class Results(Record):
    """results.json."""

    schema_version: str = Field(SCHEMA, alias="schema")
    preset: str
    created: str
    measured_on: MeasuredOn
    prompts: PromptsInfo
    timing: Timing
    drafters: dict[str, DrafterInfo]  # per training stage read (its output subdir)
    arms: dict[str, Arm]  # in report order (AR, each method's arms, the synthetic arms)
    concurrency: list[ConcurrencyRow] = Field(default_factory=list)
    sampling: Sampling | None = None
    config: dict[str, Any]  # the whole config tree
    cost_at_scale: CostProfile | None = None  # the cost profile's, when the benchmark read one
    references: list[Reference] = Field(default_factory=list)  # the audit's independent references

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def arm_items(self) -> list[tuple[str, Arm]]:
        """(arm id, arm) pairs in report order: as the benchmark wrote them
        (`peftbd.benchmarking.arms.arm_specs`)."""
        return list(self.arms.items())

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, by_alias=True)

    def write(self, path: Path) -> None:
        path.write_text(self.to_json())

    @classmethod
    def from_dict(cls, data: Any, where: str = "results.json") -> Results:
        """Results from their JSON form; a file of another schema version, or one whose shape does
        not fit, is refused with the key and the fix."""
        found = data.get("schema") if isinstance(data, dict) else None
        if found != SCHEMA:
            raise UserError(f"{where}: schema {found!r}, this code reads {SCHEMA!r}: rerun the "
                            "benchmark (python -m jobs.benchmark) to rewrite it")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise misfit(where, e, "a results.json",
                         "rerun the benchmark (python -m jobs.benchmark)") from None

    @classmethod
    def read(cls, path: Path) -> Results:
        return cls.from_dict(json.loads(path.read_text()), str(path))


def stat(values: Sequence[float]) -> Stat:
    """Mean and sample standard deviation (0 for a single value)."""
    n = len(values)
    if n == 0:
        raise ValueError("stat() needs at least one value")
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0
    return Stat(mean=mean, std=math.sqrt(var))


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def draft_verify_per_round(arm: Arm) -> float | None:
    """What drafting costs per round relative to verifying: mean draft ms per round (every draft
    call of the round) / mean verify ms per round; None for AR."""
    return _ratio(arm.round.draft_ms, arm.round.verify_ms) if arm.speculative else None


def draft_verify_per_call(arm: Arm) -> float | None:
    """Mean draft forward ms / mean verify forward ms (one call each); None without draft calls."""
    d, v = arm.forward.draft, arm.forward.verify
    return _ratio(d.mean_ms, v.mean_ms) if d.calls else None
