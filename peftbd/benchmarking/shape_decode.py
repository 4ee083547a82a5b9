"""Measured decoding at the paper's architecture: greedy AR beside every synthetic arm.

Random weights accept nothing of their own, so each drafter decodes under controlled acceptance
(`decoding.synthetic`, e.g. the paper's 2.881 tokens per round for PEFT-BD;
`peftbd.decoding.controlled`): every draft and verify forward is real, the acceptance is the
profile's, every output is AR's (checked). It gives throughput measured at this shape on this
hardware, per round the draft, verify and host (everything else) ms, and per forward the measured
ms against its floor on this device (`peftbd.benchmarking.device_floor`): "x over floor".

Every engine runs on `decoding.fast_path` (auto: compiled on CUDA, eager elsewhere) and each arm
records its device, dtype, forward paths and, compiled on CUDA, what the CUDA-graph trees did over
its timed decodes (`ArmRun`).

The cost profile (`peftbd.benchmarking.cost_profile`) runs it on its models, at its first dtype.
"""

from __future__ import annotations

import copy
import logging
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from peftbd.benchmarking.arms import ArmModels, ArmSpec
from peftbd.benchmarking.cost_profile_models import activate, arm_run, counting, graph_use
from peftbd.benchmarking.cost_profile_schema import DeviceFloor, ShapeArm, ShapeDecode
from peftbd.benchmarking.forward_counter import RoundCount
from peftbd.config import Config
from peftbd.decoding import DecodeResult, DecodeState, RaggedKV, SpeculativeDecoder, result_of
from peftbd.decoding.controlled import reference_oracle
from peftbd.decoding.loop import POOL_ROOM
from peftbd.decoding.state import all_feature_layers, with_feature_layers
from peftbd.decoding.verify import prefill_rows

log = logging.getLogger(__name__)

WARMUP_TOKENS = 4


def _prompts(cfg: Config, vocab: int) -> list[list[int]]:
    cp = cfg.cost_profile
    generator = torch.Generator().manual_seed(cfg.training.seed + 1)
    return [torch.randint(0, vocab, (cp.kv_len,), generator=generator).tolist()
            for _ in range(cp.decode_prompts)]


def _arm(spec: ArmSpec, runs: Sequence[DecodeResult], ar_tps: float | None, exact: bool,
         count: RoundCount, floor: DeviceFloor, ran: dict[str, Any]) -> ShapeArm:
    rounds = [r for run in runs for r in run.rounds]
    tokens, seconds = sum(len(r.tokens) for r in runs) - len(runs), sum(r.total_ms for r in rounds) / 1e3
    calls = {m: sum(r.forward_calls.get(m, 0) for r in runs) for m in ("draft", "verify")}
    spent = {m: sum(r.forward_seconds.get(m, 0.0) for r in runs) for m in ("draft", "verify")}
    draft_fw = 1e3 * spent["draft"] / calls["draft"] if calls["draft"] else None
    verify_fw = 1e3 * spent["verify"] / calls["verify"]
    floor_draft = sum(floor.forward_ms(f) for f in count.draft)
    floor_verify = sum(floor.forward_ms(f) for f in count.verify)
    draft_round = statistics.fmean(r.draft_ms for r in rounds)
    verify_round = statistics.fmean(r.verify_ms for r in rounds)
    tps = tokens / seconds
    return ShapeArm(
        **ran, label=spec.label, synthetic=spec.synthetic, tokens=tokens, rounds=len(rounds),
        seconds=round(seconds, 3), tokens_per_s=round(tps, 3),
        speedup_vs_ar=round(tps / (ar_tps or tps), 4),
        mean_accepted=round(statistics.fmean(r.emitted for r in rounds), 4), exact=exact,
        draft_ms_round=round(draft_round, 3), verify_ms_round=round(verify_round, 3),
        host_ms_round=round(statistics.fmean(r.total_ms for r in rounds) - draft_round
                            - verify_round, 3),
        draft_ms_forward=None if draft_fw is None else round(draft_fw, 3),
        verify_ms_forward=round(verify_fw, 3),
        floor_draft_ms_round=round(floor_draft, 4), floor_verify_ms_forward=round(floor_verify, 4),
        draft_x_over_floor=None if draft_fw is None or not floor_draft else round(
            draft_round / floor_draft, 2),
        verify_x_over_floor=round(verify_fw / floor_verify, 2),
    )


def _decode(engine: SpeculativeDecoder, start: DecodeState, budget: int) -> DecodeResult:
    """Decode from a copy of a prefilled `start` state on the engine's path (the prefill is
    shared by every arm and not timed: throughput here is the rounds')."""
    state = copy.deepcopy(start)
    state.path = engine.path
    state.max_new_tokens = min(state.max_new_tokens, budget)
    engine.drafter.start(state)
    state.mark = state.forwards.clock.now()
    while not state.done:
        engine.step(state)
    return result_of(state)


def decode_at_shape(cfg: Config, models: ArmModels, specs: Sequence[ArmSpec],
                    counts: Mapping[str, RoundCount], floor: DeviceFloor) -> ShapeDecode:
    """Decode `cost_profile.decode_prompts` random prompts of `kv_len` tokens for
    `decode_tokens` new tokens with AR and every synthetic arm in `specs` (`counts`: each arm's
    counted round, for its floor). Each prompt is prefilled once (keeping every layer's
    features: `with_feature_layers`) and every arm decodes from a copy; one short untimed warm-up per
    arm (compiled: the first prompt whole, so CUDA graphs are recorded for every shape the timed
    decodes meet), then per prompt the arms take turns, AR first (its output is the oracle and
    the audit's reference). Every prompt is prefilled into one KV pool sized once, where the
    copies decode (one static address). Throughput = tokens / the rounds' time (prefill
    excluded: it is AR's for every arm)."""
    cp = cfg.cost_profile
    arms = [s for s in specs if s.method == "ar"] + [s for s in specs if s.synthetic is not None]
    references: dict[tuple[int, ...], list[int]] = {}
    oracle = reference_oracle(references)
    engines = {s.id: SpeculativeDecoder(models.verifier_for(s),
                                        models.drafter_for(s, oracle, cfg.decoding.synthetic_seed),
                                        (), cp.decode_tokens, fast_path=cfg.decoding.fast_path)
               for s in arms}
    graphs = {arm: graph_use(engine) for arm, engine in engines.items()}
    prompts = _prompts(cfg, models.verifier.config.vocab_size)
    every_layer = all_feature_layers(models.verifier.config.num_hidden_layers)
    pool = RaggedKV([], models.device)
    pool.size_for(len(prompts) + 1, cp.kv_len + cp.decode_tokens + POOL_ROOM)  # and a copy
    prefilled = [prefill_rows(models.verifier, [p], [cp.decode_tokens], feature_layers=every_layer,
                              pool=pool)[0] for p in prompts]

    def run(spec: ArmSpec, i: int, budget: int) -> DecodeResult:
        activate(models, spec)
        engine = engines[spec.id]
        start = with_feature_layers(prefilled[i], engine.drafter.feature_layers)
        result = _decode(engine, start, budget)
        if spec.method == "ar":
            references[tuple(prompts[i])] = result.tokens
        return result

    for spec in arms:
        run(spec, 0, cp.decode_tokens if engines[spec.id].path.compiled else WARMUP_TOKENS)
    runs: dict[str, list[DecodeResult]] = {s.id: [] for s in arms}
    for i in range(len(prompts)):
        for spec in arms:
            with counting(graphs[spec.id]):
                runs[spec.id].append(run(spec, i, cp.decode_tokens))
        log.info("shape decode: prompt %d/%d done", i + 1, len(prompts))
    ar_tps = None
    out = {}
    for spec in arms:
        exact = all(r.tokens == references[tuple(p)] for p, r in zip(prompts, runs[spec.id]))
        out[spec.id] = _arm(spec, runs[spec.id], ar_tps, exact, counts[spec.id], floor,
                            arm_run(engines[spec.id], graphs[spec.id]))
        ar_tps = ar_tps or out[spec.id].tokens_per_s
    return ShapeDecode(prompts=len(prompts), prompt_len=cp.kv_len, max_new_tokens=cp.decode_tokens,
                       dtype=floor.dtype, seed=cfg.decoding.synthetic_seed, floor=floor, arms=out)
