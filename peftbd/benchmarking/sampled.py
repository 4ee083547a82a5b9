"""Acceptance under sampling: each arm's batch-1 pass at every `decoding.temperatures` entry T > 0
over the first `decoding.sampling_prompts` prompts, and results.json's `sampling` block.

A sampled request draws with `SamplingParams(T, seed=prompt_seed(decoding.sampling_seed, its
prompt's id))` (top-p 1, top-k 0), so a rerun draws the same whatever the worker count; the engine
verifies it with lossless speculative sampling (`peftbd.decoding.sampling`). Its output cannot be
audited token for token against AR's (each drafter's rounds use the draws differently):
losslessness at T > 0 is proven by the statistical tests (tests/peftbd/decoding/test_sampling.py),
and each output is only checked to be a valid sample (`valid_sample`). T = 0 is the greedy
batch-1 pass itself on the same prompts, not decoded again. Synthetic arms sit out T > 0 (SKIPPED).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from peftbd.benchmarking.arms import ArmSpec
from peftbd.benchmarking.concurrency import WARMUP_TOKENS
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.schema import Check, Sampled, SampledArm, Sampling
from peftbd.config import Config, ConfigError
from peftbd.decoding import DecodeResult, SamplingParams, SpeculativeDecoder, summarize

SKIPPED = ("controlled acceptance forces the drafts to greedy AR's tokens, so it cannot hold its "
           "profile under sampling (the engine refuses a sampled request for it)")
HOW = ("per temperature > 0, the arms that sample take turns at one batch-1 pass over the prompts "
       "(after one short untimed sampled warm-up each), each request seeded by decoding."
       "sampling_seed and its prompt id; top-p 1, top-k 0; tok/s = tokens / summed per-prompt "
       "decode time. Temperature 0: the greedy batch-1 pass on the same prompts (every repeat).")


@dataclass(frozen=True)
class SamplingPlan:
    """What a worker decodes sampled: `temperatures` (all > 0), its `prompts`, the base `seed`."""

    temperatures: tuple[float, ...] = ()
    prompts: tuple[Prompt, ...] = ()
    seed: int = 0


@dataclass
class SampledPass:
    """One arm's batch-1 decodes of a worker's sampled prompts at one temperature, and the ids of
    the prompts whose output is not a valid sample."""

    arm: str
    temperature: float
    results: list[DecodeResult]
    invalid: list[str]


def sampled_temperatures(cfg: Config) -> tuple[float, ...]:
    """`decoding.temperatures` above 0; one that the engine would decode greedily is an error."""
    low = [t for t in cfg.decoding.temperatures if t > 0 and SamplingParams(t).greedy]
    if low:
        raise ConfigError(f"config key 'decoding.temperatures': {low[0]} decodes greedily (below "
                          "1e-5, as vLLM); use 0 for greedy or a temperature of at least 1e-5")
    return tuple(t for t in cfg.decoding.temperatures if t > 0)


def sampled_prompts(cfg: Config, prompts: Sequence[Prompt]) -> list[Prompt]:
    """The prompts of the sampled passes: the first `decoding.sampling_prompts` (0: all)."""
    return list(prompts[: cfg.decoding.sampling_prompts or None])


def samples(spec: ArmSpec) -> bool:
    """True for an arm that decodes at T > 0 (every arm but the synthetic ones)."""
    return spec.synthetic is None


def prompt_seed(seed: int, prompt_id: str) -> int:
    """A request's seed (63 bits) from the run's `seed` and its prompt's id only."""
    digest = hashlib.blake2b(f"{seed}:{prompt_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def valid_sample(tokens: Sequence[int], eos_ids: Sequence[int], budget: int, vocab: int) -> bool:
    """1 to `budget` token ids below `vocab`, no EOS but possibly the last; ending on EOS or at
    the budget."""
    if not 0 < len(tokens) <= budget or not all(0 <= t < vocab for t in tokens):
        return False
    return not set(tokens[:-1]) & set(eos_ids) and (tokens[-1] in eos_ids or len(tokens) == budget)


def sample_arms(decoders: Mapping[str, SpeculativeDecoder], specs: Sequence[ArmSpec],
                plan: SamplingPlan, vocab: int,
                done: Callable[[str, float], None] = lambda arm, t: None) -> list[SampledPass]:
    """Per temperature of `plan`, the arms that `samples` take turns at one batch-1 pass over its
    prompts with their `decoders` (one short untimed sampled warm-up each first); `done` hears
    of each pass."""
    arms = [s.id for s in specs if samples(s)] if plan.temperatures and plan.prompts else []
    for arm in arms:
        dec = decoders[arm]
        dec.decode(plan.prompts[0].prompt_ids, min(WARMUP_TOKENS, dec.max_new_tokens),
                   SamplingParams(plan.temperatures[0], seed=plan.seed))
    passes = []
    for t in plan.temperatures:
        for arm in arms:
            dec = decoders[arm]
            results = [dec.decode(p.prompt_ids, None,
                                  SamplingParams(t, seed=prompt_seed(plan.seed, p.id)))
                       for p in plan.prompts]
            invalid = [p.id for p, r in zip(plan.prompts, results)
                       if not valid_sample(r.tokens, dec.eos_ids, dec.max_new_tokens, vocab)]
            passes.append(SampledPass(arm, t, results, invalid))
            done(arm, t)
    return passes


def sampling_entry(temperature: float, results: Sequence[DecodeResult],
                   invalid: Sequence[str] | None) -> Sampled:
    """One arm at one temperature (results.json `sampling.arms.*.by_temperature[]`): the engine's
    run metrics over `results`; `invalid`: the prompts whose output is no valid sample (None at
    T = 0, which the greedy audit covers)."""
    m = summarize(results)
    keys = ("tokens_per_s", "mean_accepted", "mean_accepted_prefix", "token_acceptance",
            "new_tokens", "decode_s", "rounds", "per_position")
    check = None if invalid is None else Check(prompts=len(results),
                                               valid=len(results) - len(invalid),
                                               invalid=list(invalid))
    return Sampled(temperature=temperature, **{k: m[k] for k in keys}, check=check)


def sampling_block(specs: Sequence[ArmSpec], temperatures: Sequence[float], seed: int,
                   prompts: int, greedy: Mapping[str, Sequence[DecodeResult]],
                   passes: Sequence[SampledPass]) -> Sampling:
    """results.json's `sampling` over `prompts` sampled prompts: per arm and temperature its
    entry; T = 0 from `greedy` ({arm: its greedy batch-1 decodes of those prompts}), T > 0 from
    the workers' `passes`; a synthetic arm has T = 0 only and says why (`skipped`)."""
    arms: dict[str, SampledArm] = {}
    for spec in specs:
        entries = []
        for t in temperatures:
            if t == 0:
                entries.append(sampling_entry(0.0, greedy[spec.id], None))
            elif samples(spec):
                mine = [p for p in passes if p.arm == spec.id and p.temperature == t]
                entries.append(sampling_entry(t, [r for p in mine for r in p.results],
                                              [i for p in mine for i in p.invalid]))
        arms[spec.id] = SampledArm(label=spec.label, skipped=None if samples(spec) else SKIPPED,
                                   by_temperature=entries)
    return Sampling(temperatures=list(temperatures), seed=seed, prompts=prompts, how=HOW, arms=arms)
