"""Time every arm over a shard of prompts in this process, greedy: batch 1 (one prompt at a
time), and the concurrency sweep (`decoding.batch_sizes`: continuous batching, at most B at once);
then sampled, batch 1, at each `decoding.temperatures` entry > 0 (`peftbd.benchmarking.sampled`).

A shard is what one timing worker does. Per repeat, the arms take turns over the whole shard
(AR, PEFT-BD, ..., then the next repeat; at each batch size likewise), so slow drifts of the
machine spread over every arm instead of landing on one. Each arm first decodes a few tokens
untimed at each batch size (warm-up: allocator, kernels, lazy init; a whole prompt with the fast
path). The greedy
audit compares each speculative arm's first-repeat batch-1 output with AR's, and AR's with
independent engines' on a sample (`peftbd.benchmarking.references`). Last, untimed, each
one-step drafter's rounds are replayed offline on the prompts + AR's outputs
(`peftbd.benchmarking.replay`): the offline estimate beside the engine's acceptance; and one
round per arm is counted forward by forward and priced at the device's floor
(`peftbd.benchmarking.device_floor`), the basis of the report's "x over floor".
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from peftbd import progress
from peftbd.benchmarking.arms import ArmModels, ArmSpec, DrafterDirs, load_arm_models
from peftbd.benchmarking.concurrency import WARMUP_TOKENS, BatchRun, batch_run
from peftbd.benchmarking.cost_profile_schema import DeviceFloor
from peftbd.benchmarking.device_floor import measure_floor
from peftbd.benchmarking.environment import engine_description, hardware_description
from peftbd.benchmarking.forward_counter import ForwardCounter, RoundCount
from peftbd.benchmarking.forward_paths import check_like_for_like
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.references import ReferenceCheck, reference_checks
from peftbd.benchmarking.replay import ReplaySums, replay_arms
from peftbd.benchmarking.sampled import (
    SampledPass,
    SamplingPlan,
    sample_arms,
    sampled_prompts,
    sampled_temperatures,
    samples,
)
from peftbd.config import Config
from peftbd.decoding import DecodeResult, Mismatch, SpeculativeDecoder, compare
from peftbd.decoding.clock import Clock
from peftbd.decoding.fast_path import FastPathSetting
from peftbd.decoding.graph_audit import CudaGraphUse, cuda_graph_use
from peftbd.decoding.packed import PREFILL_CHUNK
from peftbd.decoding.controlled import Oracle, reference_oracle
from peftbd.manifest import peak_gpu_mib, peak_rss_mib
from peftbd.process_setup import ready
from peftbd.progress import Sink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Compiles:
    """An arm's fast-path compiles on one worker: `seconds` of compiling in all (its warm-ups'),
    how many graphs compiled inside its timed passes instead (0: steady state throughout), and
    on CUDA what the CUDA-graph trees did over its passes (None elsewhere)."""

    seconds: float
    timed: int
    cuda_graphs: CudaGraphUse | None = None


@dataclass
class ShardResult:
    """One worker's measurements: `results[arm][repeat][i]` decodes `prompt_ids[i]` (batch 1);
    `batch_runs` are its timed passes of the concurrency sweep (batch 1 included);
    `mismatches[arm]` are the audit's findings (empty: every output equals AR's); `replay`, each
    one-step drafter's offline estimate on the same prompts."""

    prompt_ids: list[str]
    results: dict[str, list[list[DecodeResult]]]
    batch_runs: list[BatchRun] = field(default_factory=list)
    mismatches: dict[str, list[Mismatch]] = field(default_factory=dict)
    replay: dict[str, ReplaySums] = field(default_factory=dict)
    """{arm: its rounds replayed offline on these prompts + AR's outputs} (`replay_arms`)."""
    sampled: list[SampledPass] = field(default_factory=list)
    """Each arm's sampled batch-1 pass per temperature > 0 (`peftbd.benchmarking.sampled`)."""
    floors: dict[str, RoundFloor] = field(default_factory=dict)
    """{arm: the floor of one counted round on this worker's device} (`round_floors`)."""
    floor: DeviceFloor | None = None
    paths: dict[str, dict[str, str]] = field(default_factory=dict)
    """{arm: the path of each forward of its round} (`SpeculativeDecoder.forward_paths`)."""
    compiles: dict[str, Compiles] = field(default_factory=dict)
    """{arm: its fast-path compiles} (arms on the fast path only)."""
    references: list[ReferenceCheck] = field(default_factory=list)
    """AR's outputs against independent engines' (`peftbd.benchmarking.references`)."""
    device: str = ""
    hardware: str = ""
    engine: str = ""
    dtype: str = ""
    peak_rss_mib: float = 0.0
    peak_gpu_mib: float | None = None


@dataclass
class Timings:
    """What `time_arms` measured: the batch-1 decodes (`results[arm][repeat][i]`), every
    timed pass of the concurrency sweep and the sampled passes."""

    results: dict[str, list[list[DecodeResult]]]
    batch_runs: list[BatchRun]
    sampled: list[SampledPass] = field(default_factory=list)
    paths: dict[str, dict[str, str]] = field(default_factory=dict)  # forward_paths per arm
    compiles: dict[str, Compiles] = field(default_factory=dict)  # arms on the fast path


def time_arms(models: ArmModels, specs: Sequence[ArmSpec], prompts: Sequence[Prompt],
              repeats: int, max_new_tokens: int, batch_sizes: Sequence[int] = (1,),
              sweep_repeats: int | None = None, seed: int = 0,
              fast_path: FastPathSetting = False, sampling: SamplingPlan = SamplingPlan(),
              sweep_variants: bool = True, prefill_chunk: int = PREFILL_CHUNK) -> Timings:
    """Decode every prompt with every arm, `repeats` times, after one short untimed warm-up per
    arm (`_warm_up`; with `fast_path`, whose graphs compile per shape, every timed pass once):
    per repeat, first the batch-1 pass (the arms take turns, each over every prompt, one at a
    time), then, in the first `sweep_repeats` repeats (default: all), per batch size > 1 in
    `batch_sizes` the arms take turns at one `decode_many` pass each (after one short untimed
    warm-up per arm and batch size; `sweep_variants` false: AR and each method's own arm only,
    `swept`). Every pass is timed whole with the device-synced clock
    (`peftbd.benchmarking.concurrency`) and kept as counts only (a `BatchRun`), checked against
    AR's first batch-1 pass (AR goes first). Synthetic arms draw with `seed` against greedy AR's
    outputs, decoded first, untimed (`synthetic_oracle`); `fast_path`: every round forward
    compiled (`peftbd.decoding.fast_path`; its compiles fall in the warm-ups, `compiles` counts
    any that did not), refused when it
    would time some arm's forward on another path than AR's step (`forward_paths`). Last, the
    sampled passes of `sampling` (`peftbd.benchmarking.sampled.sample_arms`)."""
    specs = sorted(specs, key=lambda s: s.method != "ar")  # AR first: the exactness reference
    ids = [p.prompt_ids for p in prompts]
    oracle = synthetic_oracle(models, specs, ids, max_new_tokens)
    decoders = {s.id: SpeculativeDecoder(models.verifier_for(s), models.drafter_for(s, oracle, seed),
                                         models.eos_ids, max_new_tokens, fast_path, prefill_chunk)
                for s in specs}
    rows = min(max(batch_sizes, default=1), len(ids))
    for decoder in decoders.values():  # every pass's KV in one allocation: no growth, no recompile
        decoder.reserve(rows, max(map(len, ids), default=0) + max_new_tokens)
    paths = {arm: decoder.forward_paths() for arm, decoder in decoders.items()}
    check_like_for_like(paths)  # before any compile or timing
    batched = [b for b in batch_sizes if b > 1]
    in_sweep = [s for s in specs if swept(s, sweep_variants)]
    graphs = {arm: CudaGraphUse() for arm, d in decoders.items()
              if d.path.compiled and models.device.type == "cuda"}

    def counted(arm: str) -> contextlib.AbstractContextManager[object]:
        """Count the arm's CUDA-graph use inside (on CUDA, compiled; else nothing)."""
        return cuda_graph_use(graphs[arm]) if arm in graphs else contextlib.nullcontext()

    for s in specs:
        with counted(s.id):
            _warm_up(decoders[s.id], ids, batched if s in in_sweep else [], max_new_tokens)
    warm = {arm: d.path.compiles for arm, d in decoders.items()}
    clock = Clock(models.device)
    results: dict[str, list[list[DecodeResult]]] = {s.id: [] for s in specs}
    runs: list[BatchRun] = []
    sweeps = repeats if sweep_repeats is None else min(sweep_repeats, repeats)
    total = ((repeats * len(specs) + sweeps * len(batched) * len(in_sweep)) * len(prompts)
             + len(sampling.temperatures) * sum(map(samples, specs)) * len(sampling.prompts))
    done = 0
    for r in range(repeats):
        for s in specs:
            run: list[DecodeResult] = []
            start = clock.now()
            with counted(s.id):
                for p in prompts:
                    run.append(decoders[s.id].decode(p.prompt_ids))
                    done += 1
                    progress.report(done, total, arm=s.id)
            wall = clock.now() - start
            results[s.id].append(run)
            if 1 in batch_sizes:
                runs.append(batch_run(s.id, 1, r, wall, run, [x.tokens for x in results["ar"][0]]))
            log.info("repeat %d/%d %s: %d prompts, %d tokens in %.2fs", r + 1, repeats, s.id,
                     len(run), sum(len(x.tokens) for x in run), sum(x.decode_s for x in run))
        for b in batched if r < sweeps else ():
            for s in in_sweep:
                start = clock.now()
                with counted(s.id):
                    run = decoders[s.id].decode_many(ids, b)
                wall = clock.now() - start
                runs.append(batch_run(s.id, b, r, wall, run, [x.tokens for x in results["ar"][0]]))
                done += len(prompts)
                progress.report(done, total, arm=s.id, batch_size=b)

    def on_pass(arm: str, temperature: float) -> None:
        nonlocal done
        done += len(sampling.prompts)
        progress.report(done, total, arm=arm, temperature=temperature)

    compiles = {arm: Compiles(round(d.path.compile_s, 2), d.path.compiles - warm[arm], graphs.get(arm))
                for arm, d in decoders.items() if d.path.compiled}
    vocab = models.verifier.config.vocab_size
    return Timings(results, runs, sample_arms(decoders, specs, sampling, vocab, on_pass), paths,
                   compiles)


def _warm_up(decoder: SpeculativeDecoder, ids: Sequence[Sequence[int]], batch_sizes: Sequence[int],
             max_new_tokens: int) -> None:
    """Untimed decodes before an arm's timed passes: one short decode at batch 1 and one short
    pass at each batch size > 1; on the fast path every timed pass once, whole (greedy decodes
    repeat their shapes, so each graph the timed passes use compiles here, not inside them)."""
    if decoder.path.compiled:
        for prompt in ids:
            decoder.decode(prompt)
        for b in batch_sizes:
            decoder.decode_many(ids, b)
        return
    decoder.decode(ids[0], min(WARMUP_TOKENS, max_new_tokens))
    for b in batch_sizes:
        decoder.decode_many(ids[:b], b, min(WARMUP_TOKENS, max_new_tokens))


def swept(spec: ArmSpec, variants: bool) -> bool:
    """Whether `spec` decodes in the concurrency sweep's batched passes: every arm with
    `variants`, else AR and each method's own arm (its id is its method's), not the variants
    (PEFT-BD's 2-step or anchored decoding, the head's draft vocabulary, the synthetic arms)."""
    return variants or spec.id == spec.method


def synthetic_oracle(models: ArmModels, specs: Sequence[ArmSpec], prompts: Sequence[list[int]],
                     max_new_tokens: int) -> Oracle | None:
    """Greedy AR's outputs of `prompts` as the synthetic arms' oracle (None: no synthetic arm)."""
    if all(s.synthetic is None for s in specs):
        return None
    ar = SpeculativeDecoder(models.verifier, None, models.eos_ids, max_new_tokens)
    return reference_oracle({tuple(p): ar.decode(p).tokens for p in prompts})


@dataclass(frozen=True)
class RoundFloor:
    """A round's floor on the device (ms): its draft forwards together, its verify forward."""

    draft_ms_round: float
    verify_ms_forward: float


def round_floors(models: ArmModels, specs: Sequence[ArmSpec], prompt: Sequence[int],
                 max_new_tokens: int, floor: DeviceFloor, oracle: Oracle | None,
                 seed: int) -> dict[str, RoundFloor]:
    """Per arm, one untimed round on `prompt` counted forward by forward (`ForwardCounter`) and
    priced at `floor` (a round that drafts its whole block, when the budget allows)."""
    out = {}
    for spec in specs:
        dec = SpeculativeDecoder(models.verifier_for(spec), models.drafter_for(spec, oracle, seed),
                                 models.eos_ids, max_new_tokens)
        state = dec.start(prompt)
        if state.done:
            continue
        counter = ForwardCounter()
        state.forwards.observer = counter.forward
        dec.step(state)
        count = RoundCount.of(counter.forwards)
        out[spec.id] = RoundFloor(round(sum(floor.forward_ms(f) for f in count.draft), 5),
                                  round(floor.forward_ms(count.verify[0]), 5))
    return out


def audit(models: ArmModels, specs: Sequence[ArmSpec], prompts: Sequence[Prompt],
          results: dict[str, list[list[DecodeResult]]]) -> dict[str, list[Mismatch]]:
    """Every speculative arm's outputs (first repeat) against greedy AR's, via the engine's
    `compare` (which reports the first divergent position and the verifier's top-2 margin)."""
    ar = results["ar"][0]
    found: dict[str, list[Mismatch]] = {}
    for s in specs:
        if s.method == "ar":
            continue
        pairs = zip(prompts, ar, results[s.id][0])
        found[s.id] = [m for p, a, b in pairs
                       if (m := compare(models.verifier, p.id, p.prompt_ids, a.tokens, b.tokens))]
    return found


def run_shard(cfg: Config, dirs: DrafterDirs, specs: Sequence[ArmSpec], prompts: Sequence[Prompt],
              repeats: int, sink: Sink | None = None,
              sampled: Sequence[Prompt] | None = None, references: bool = True) -> ShardResult:
    """Load the models (`dirs`: where the drafters lie), time every arm over `prompts` and audit
    them (one process, serial); `sink` hears of every decoded prompt; `sampled`: the prompts of
    the sampled passes (None: `sampled_prompts` of `prompts`); `references`: whether this shard
    also checks AR against the independent engines (one shard of a run does: one vLLM engine)."""
    ready(cfg)  # a Ray task: the methods its arms name, the world it loads
    if sampled is None:
        sampled = sampled_prompts(cfg, prompts)
    plan = SamplingPlan(sampled_temperatures(cfg), tuple(sampled), cfg.decoding.sampling_seed)
    with progress.listening(sink):
        return _run_shard(cfg, dirs, specs, prompts, repeats, plan, references)


def _run_shard(cfg: Config, dirs: DrafterDirs, specs: Sequence[ArmSpec],
               prompts: Sequence[Prompt], repeats: int, plan: SamplingPlan,
               check_references: bool) -> ShardResult:
    if cfg.decoding.torch_threads > 0:
        torch.set_num_threads(cfg.decoding.torch_threads)
    if not any(s.method == "ar" for s in specs):
        raise ValueError("the benchmark needs the 'ar' arm: it is the greedy audit's reference")
    models = load_arm_models(cfg, dirs)
    timings = time_arms(models, specs, prompts, repeats, cfg.decoding.max_new_tokens,
                        cfg.decoding.batch_sizes, cfg.decoding.sweep_repeats,
                        cfg.decoding.synthetic_seed, cfg.decoding.fast_path, plan,
                        cfg.decoding.sweep_variants, cfg.decoding.prefill_chunk)
    references = [r.tokens for r in timings.results["ar"][0]]
    dtype = next(models.verifier.parameters()).dtype
    floor = measure_floor(models.device, dtype, hardware_description(models.device))
    oracle = reference_oracle({tuple(prompts[0].prompt_ids): references[0]})
    return ShardResult(
        prompt_ids=[p.id for p in prompts], results=timings.results, batch_runs=timings.batch_runs,
        sampled=timings.sampled,
        mismatches=audit(models, specs, prompts, timings.results),
        references=reference_checks(cfg, models.verifier, models.eos_ids, models.pad_id, prompts,
                                    references, cfg.decoding.max_new_tokens) if check_references else [],
        replay=replay_arms(models, specs, prompts, references, cfg.decoding.max_new_tokens),
        floors=round_floors(models, specs, prompts[0].prompt_ids, cfg.decoding.max_new_tokens,
                            floor, oracle, cfg.decoding.synthetic_seed),
        floor=floor, paths=timings.paths, compiles=timings.compiles,
        device=str(models.device), hardware=hardware_description(models.device),
        engine=engine_description(cfg.model.attn_implementation),
        dtype=str(next(models.verifier.parameters()).dtype).removeprefix("torch."),
        peak_rss_mib=round(peak_rss_mib(), 1), peak_gpu_mib=peak_gpu_mib(),
    )
