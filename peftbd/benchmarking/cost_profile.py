"""The draft-cost profile: what one round of every arm costs at the paper's architecture.

The paper's central fact is a cost fact at Qwen3-0.6B (a LoRA draft forward costs as much as a
verify forward), which a tiny model cannot show. This builds `cost_profile.architecture`
(`peftbd.models.architecture`: random weights where none are local), attaches every drafter as
the benchmark does (`peftbd.benchmarking.arms`: `arm_specs`, `ArmModels.drafter_for`, so a new
drafter joins by joining the benchmark) and times their rounds with the engine's own
`SpeculativeDecoder.step` and clock:

- one backbone serves every arm (`peftbd.benchmarking.cost_profile_models`): the PEFT-BD adapters
  are named adapters of one peft model (rank and alpha `cost_profile.lora_r` / `lora_alpha`, the
  paper's 16 / 32, on the run's `peftbd.target_modules` plus the mask row; the early-exit one
  adapts the first `cost_profile.early_exit_layers` layers), AR and FastMTP verify with the
  adapters off, the MTP head and the block-diffusion head (`head.layers`, three feature layers
  spread over the depth, DFlash's choice; its draft-vocabulary arm over `cost_profile.draft_vocab`
  tokens) are random and bound to the same backbone;
- the state is prefilled once over `kv_len` random tokens, keeping every layer's features; each
  arm starts from it keeping the features its drafter reads (the head's; the other arms' verify
  forwards keep none: `with_feature_layers`); each arm runs one untimed warm-up
  round, then every timed round starts from a copy of that state, so all rounds see the same KV
  length; arms take turns per repeat; medians (and minima) over `repeats`; arms that draft with
  the same settings (`cost_key`: the offsets ablation and `peftbd`) are timed once;
- every engine runs on `decoding.fast_path` (auto: compiled on CUDA, eager elsewhere), every
  state's KV in one pool sized once (copies take its free rows); compiled, each arm runs two
  more untimed rounds before its timed ones at each dtype (`_Arm.warm`); each arm records its
  device, dtype, forward paths and, compiled on CUDA, what the CUDA-graph trees did over its
  timed rounds (`ArmRun`): with `decoding.fast_path: true` an arm that ran without CUDA graphs
  is an error (`cuda_graph_fallbacks`), with auto a loud line in the summary and the report;
- dtypes in `cost_profile.dtypes` are timed in turn, the model and state cast between them;
- one more (untimed) round per arm is counted by `ForwardCounter`: FLOPs and bytes per forward,
  the basis of the roofline bound (`peftbd.benchmarking.roofline`), and the largest tensor a
  draft forward makes;
- the mask row's cost: peft's trainable-token wrappers (which copy the whole embedding and LM
  head per forward) vs the engine's `draft_embeddings` / `draft_logits`;
- at the first dtype, measured decoding (`peftbd.benchmarking.shape_decode`): AR and the
  synthetic arms (`decoding.synthetic`: the drafters' real forwards at a chosen acceptance)
  decode whole requests, each forward set against its floor on this device.

No Ray here: `jobs.cost_profile` runs it as a Ray task and as a stage of the main job.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from peft import PeftModel

from peftbd.benchmarking.arms import ArmModels
from peftbd.benchmarking.cost_profile_schema import (
    ArmCost,
    ArmWork,
    CostProfile,
    DtypeProfile,
    MaskRowCost,
    ProfiledArchitecture,
    Roofline,
)
from peftbd.benchmarking.cost_profile_models import (
    activate,
    arm_run,
    backbone_parameters,
    cost_key,
    counting,
    draft_parameters,
    graph_use,
    preflight,
    profile_models,
    profiled_specs,
)
from peftbd.benchmarking.device_floor import measure_floor
from peftbd.benchmarking.environment import hardware_description, native_dtype
from peftbd.benchmarking.forward_counter import ForwardCounter, RoundCount
from peftbd.benchmarking.forward_paths import cuda_graph_fallbacks, fell_back_line, ran_words
from peftbd.benchmarking.roofline import BF16_BYTES, GPUS, phase_ms
from peftbd.benchmarking.shape_decode import decode_at_shape
from peftbd.config import Config, ConfigError
from peftbd.decoding import SpeculativeDecoder
from peftbd.decoding.clock import Clock
from peftbd.decoding.fast_path import EAGER, FastPathSetting
from peftbd.decoding.loop import POOL_ROOM
from peftbd.decoding.ragged import RaggedKV, RowCache
from peftbd.decoding.state import DecodeState, all_feature_layers, with_feature_layers
from peftbd.decoding.verify import prefill_rows, unwrap
from peftbd.manifest import peak_gpu_mib, peak_rss_mib
from peftbd.methods import ArmSpec
from peftbd.methods.peft_bd import TRAIN_PEFTBD, WHOLE_ADAPTER
from peftbd.models.loading import DTYPES, resolve_device
from peftbd.models.peft_bd import (
    adapter_on,
    draft_embeddings,
    draft_input_ids,
    draft_logits,
)
from peftbd.process_setup import ready

log = logging.getLogger(__name__)

_BUDGET = 1 << 20  # new tokens a profiled request may take: never the reason a round stops


def profile_device(name: str) -> torch.device:
    """`cost_profile.device` resolved; a CUDA device this process does not see is an error naming
    the field (not torch's assertion half-way through building the models)."""
    device = resolve_device(name)
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.type == "cuda" and (device.index or 0) >= seen:
        raise ConfigError(f"cost_profile.device={name}: this process sees {seen} CUDA device(s) "
                          "(a CPU-only torch, no GPU, or a Ray task without cost_profile.num_gpus); "
                          "set cost_profile.device=auto or cpu, or run it where the GPU is")
    return device


def _cast_state(state: DecodeState, dtype: torch.dtype) -> None:
    """Cast a state's KV caches, hidden states and features to `dtype` in place."""
    for cache in (state.cache, state.drafter_state):
        if isinstance(cache, RowCache):
            cache.kv.to(dtype)
    if state.hidden is not None:
        state.hidden = state.hidden.to(dtype)
    if state.features is not None:
        state.features = state.features.to(dtype)


def _median_ms(fn: Callable[[], Any], clock: Clock, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = clock.now()
        fn()
        times.append((clock.now() - start) * 1e3)
    return statistics.median(times)


def mask_row_cost(models: ArmModels, clock: Clock, repeats: int) -> MaskRowCost:
    """Time the mask row's two paths over one draft chunk, adapter on."""
    peft = models.modules[TRAIN_PEFTBD.name]
    if not isinstance(peft, PeftModel):
        raise TypeError(f"the cost profile's {TRAIN_PEFTBD.name} module is a {type(peft).__name__}, "
                        "not the peft model with the named adapters")
    base, d = unwrap(peft), models.block_size
    ids = draft_input_ids(0, models.mask_id, d, models.device)
    hidden = torch.randn(1, d, base.config.hidden_size, dtype=base.dtype, device=models.device)
    peft.set_adapter(WHOLE_ADAPTER)
    with adapter_on(peft):
        wrappers = _median_ms(lambda: (base.get_input_embeddings()(ids),
                                       base.get_output_embeddings()(hidden)), clock, repeats)
        engine = _median_ms(lambda: (draft_embeddings(base, ids), draft_logits(base, hidden)),
                            clock, repeats)
    return MaskRowCost(round(wrappers, 3), round(engine, 3))


class _Arm:
    """One arm's engine (on `decoding.fast_path`), its drafter and the state its timed rounds
    start from (on the engine's path)."""

    def __init__(self, models: ArmModels, spec: ArmSpec,
                 start: Callable[[tuple[int, ...]], DecodeState], fast_path: FastPathSetting) -> None:
        self.spec = spec
        activate(models, spec)
        self.engine = SpeculativeDecoder(models.verifier_for(spec), models.drafter_for(spec), (),
                                         _BUDGET, fast_path=fast_path)
        self.state = copy.deepcopy(start(self.engine.drafter.feature_layers))
        self.state.path = self.engine.path  # the prefill's is eager
        self.engine.drafter.start(self.state)
        self.engine.step(self.state)  # warm-up: lazy inits; FastMTP's head catches up with the prompt
        self.rounds: list[tuple[float, float, int, int]] = []  # (draft ms, verify ms, calls, k)
        self.graphs = graph_use(self.engine)  # over the timed rounds at the current dtype

    def cast(self, models: ArmModels, dtype: torch.dtype) -> None:
        """Move this arm to `dtype` (the models are cast already): its state, and a drafter
        rebuilt over the cast models (the head's draft-vocabulary rows are gathered anew)."""
        _cast_state(self.state, dtype)
        self.engine.drafter = models.drafter_for(self.spec) or self.engine.drafter
        self.rounds.clear()  # medians absorb the first rounds' allocations at this dtype
        self.graphs = graph_use(self.engine)

    def warm(self, models: ArmModels) -> None:
        """On the compiled path, two untimed rounds from copies of the state right before the
        timed ones, once every pool holds the rows those use (no new static address): its graphs
        compile at this dtype, and CUDA-graph trees run each once, then record it, so the timed
        rounds replay. Eager: nothing (its warm-up was at construction)."""
        if self.engine.path.compiled:
            activate(models, self.spec)
            for _ in range(2):
                self.engine.step(copy.deepcopy(self.state))

    def timed_round(self, models: ArmModels) -> None:
        activate(models, self.spec)
        state = copy.deepcopy(self.state)
        calls = state.forwards.calls.get("draft", 0)
        with counting(self.graphs):
            record = self.engine.step(state)
        self.rounds.append((record.draft_ms, record.verify_ms,
                            state.forwards.calls.get("draft", 0) - calls, record.proposed))

    def counted_round(self, models: ArmModels) -> RoundCount:
        activate(models, self.spec)
        state = copy.deepcopy(self.state)
        state.path = EAGER  # the counter sees aten ops: a compiled graph runs them out of its sight
        counter = ForwardCounter()
        state.forwards.observer = counter.forward
        self.engine.step(state)
        return RoundCount.of(counter.forwards)

    def cost(self) -> ArmCost:
        draft, verify = [r[0] for r in self.rounds], [r[1] for r in self.rounds]
        d, v = statistics.median(draft), statistics.median(verify)
        return ArmCost(
            **arm_run(self.engine, self.graphs),
            label=self.spec.label, method=self.spec.method, proposed=self.rounds[-1][3],
            kv_len=self.state.cache.get_seq_length(), draft_calls=self.rounds[-1][2],
            draft_ms_round=round(d, 3), verify_ms_round=round(v, 3),
            draft_over_verify_round=round(d / v, 4), draft_ms_round_min=round(min(draft), 3),
            verify_ms_round_min=round(min(verify), 3),
        )


def _work(count: RoundCount, gpu_name: str) -> ArmWork:
    gpu = GPUS[gpu_name]
    draft_ms, verify_ms = phase_ms(count.draft, gpu), phase_ms(count.verify, gpu)
    return ArmWork(
        draft_forwards=len(count.draft),
        draft_gflops=round(sum(f.flops for f in count.draft) / 1e9, 4),
        draft_mb=round(sum(f.bytes_at(BF16_BYTES) for f in count.draft) / 1e6, 3),
        verify_gflops=round(sum(f.flops for f in count.verify) / 1e9, 4),
        verify_mb=round(sum(f.bytes_at(BF16_BYTES) for f in count.verify) / 1e6, 3),
        roofline_draft_ms=round(draft_ms, 5), roofline_verify_ms=round(verify_ms, 5),
        roofline_draft_over_verify=round(draft_ms / verify_ms, 4),
        largest_draft_tensor=max((f.largest_output for f in count.draft), default=0),
    )


def _time_arms(arms: Sequence[_Arm], models: ArmModels, repeats: int) -> None:
    """`repeats` timed rounds per arm, the arms taking turns (the order rotating per repeat),
    after each arm's `warm`."""
    for arm in arms:
        arm.warm(models)
    for rep in range(repeats):
        for i in range(len(arms)):
            arms[(rep + i) % len(arms)].timed_round(models)


@torch.inference_mode()
def run_profile(cfg: Config) -> CostProfile:
    """Profile every arm at `cfg.cost_profile`'s architecture, KV length and dtypes."""
    ready(cfg)  # a Ray task: the methods its arms name, the world's tokenizer
    cp, started = cfg.cost_profile, time.perf_counter()
    if cp.threads > 0:
        torch.set_num_threads(cp.threads)
    device = profile_device(cp.device)
    arch = preflight(cfg)
    dtypes = list(dict.fromkeys(native_dtype(device) if d == "native" else d for d in cp.dtypes))
    models = profile_models(cfg, arch, DTYPES[dtypes[0]], device)
    specs = profiled_specs(cfg, models.verifier.config.vocab_size)
    clock = Clock(device)
    log.info("cost profile: %s (%s, weights %s) on %s, arms %s", arch.name, arch.origin,
             arch.weights, device, ", ".join(s.id for s in specs))
    generator = torch.Generator().manual_seed(cfg.training.seed)
    prompt = torch.randint(0, models.verifier.config.vocab_size, (cp.kv_len,), generator=generator)
    depth = models.verifier.config.num_hidden_layers
    # every state's KV in one pool sized once (one static address for the compiled graphs):
    # rows for the prefill, each timed arm's state and a round's copy of it
    pool = RaggedKV([], device)
    pool.size_for(len({cost_key(models, s) for s in specs}) + 2, cp.kv_len + POOL_ROOM)
    everything = prefill_rows(models.verifier, [prompt.tolist()], [_BUDGET],  # for every arm
                              feature_layers=all_feature_layers(depth), pool=pool)[0]
    start = functools.partial(with_feature_layers, everything)
    timed: dict[tuple[Any, ...], _Arm] = {}
    for spec in specs:
        if cost_key(models, spec) not in timed:
            timed[cost_key(models, spec)] = _Arm(models, spec, start, cfg.decoding.fast_path)
    arms = list(timed.values())
    counted = {a.spec.id: a.counted_round(models) for a in arms}
    work = {arm: _work(count, cp.roofline_gpu) for arm, count in counted.items()}

    def per_spec(of: dict[str, Any], twin: Callable[[Any, ArmSpec, ArmSpec], Any]) -> dict[str, Any]:
        """`of` (by timed arm id) for every spec, a twin's entry derived by `twin(entry, spec)`."""
        out = {}
        for spec in specs:
            first = timed[cost_key(models, spec)].spec
            out[spec.id] = of[first.id] if first.id == spec.id else twin(of[first.id], spec, first)
        return out

    c = models.verifier.config
    profile = CostProfile(
        architecture=ProfiledArchitecture(
            name=arch.name, origin=arch.origin, weights=arch.weights, layers=c.num_hidden_layers,
            hidden_size=c.hidden_size, vocab_size=c.vocab_size,
            parameters=backbone_parameters(models.verifier), draft_parameters=draft_parameters(models)),
        device=str(device), hardware=hardware_description(device), threads=torch.get_num_threads(),
        kv_len=cp.kv_len, repeats=cp.repeats, block_size=cfg.peftbd.block_size,
        early_exit_layers=cp.early_exit_layers, mtp_steps=cfg.fastmtp.num_steps,
        roofline=Roofline(GPUS[cp.roofline_gpu], per_spec(work, lambda w, spec, first: w)),
    )
    for i, name in enumerate(dtypes):
        if i:
            for module in (models.verifier, *models.modules.values()):
                module.to(DTYPES[name])
            for arm in arms:
                arm.cast(models, DTYPES[name])
        _time_arms(arms, models, cp.repeats)
        if not i and cp.decode_tokens and any(s.synthetic is not None for s in specs):
            floor = measure_floor(device, DTYPES[name], profile.hardware)
            profile.decode = decode_at_shape(cfg, models, specs, per_spec(
                counted, lambda count, spec, first: count), floor)
        costs = per_spec({a.spec.id: a.cost() for a in arms}, lambda cost, spec, first:
                         dataclasses.replace(cost, label=spec.label, same_as=first.id))
        profile.profiles[name] = DtypeProfile(name, costs,
                                              mask_row_cost(models, clock, min(cp.repeats, 2)))
        log.info("cost profile %s: %s", name, ", ".join(
            f"{k} {v.draft_over_verify_round:.2f}" for k, v in profile.profiles[name].arms.items()))
    cuda_graph_fallbacks(profile.timed_arms(), cfg.decoding.fast_path)  # true: an error
    profile.seconds = round(time.perf_counter() - started, 1)
    profile.peak_rss_mib, profile.peak_gpu_mib = round(peak_rss_mib(), 1), peak_gpu_mib()
    return profile


def summary_lines(profile: CostProfile) -> list[str]:
    """One line per dtype (what ran: its device and paths): each arm's draft/verify per round,
    plus the roofline's; a loud line for arms that ran without CUDA graphs."""
    arch = profile.architecture
    lines = [f"cost profile at {arch.name} ({arch.layers} layers, weights "
             f"{arch.weights}), KV {profile.kv_len}, {profile.hardware}:"]
    for run in profile.profiles.values():
        ratios = ", ".join(f"{arm} {cost.draft_over_verify_round:.2f}"
                           for arm, cost in run.arms.items() if cost.method != "ar")
        lines.append(f"  {ran_words(run.arms)}: AR step {run.arms['ar'].verify_ms_round:.1f} ms; "
                     f"draft/verify per round {ratios}")
    roof = profile.roofline
    ratios = ", ".join(f"{arm} {w.roofline_draft_over_verify:.2f}"
                       for arm, w in roof.arms.items() if w.draft_forwards)
    lines.append(f"  roofline {roof.gpu.name}: draft/verify per round {ratios}")
    if profile.decode:
        dec = profile.decode
        arms = "; ".join(
            f"{arm} {a.tokens_per_s:.2f} tok/s"
            + (f" ({a.speedup_vs_ar:.2f}x AR at {a.mean_accepted:.2f}/round)" if a.synthetic else "")
            + f", verify {a.verify_x_over_floor:.1f}x floor"
            for arm, a in dec.arms.items())
        lines.append(f"  measured decode, SYNTHETIC acceptance ({ran_words(dec.arms)}, "
                     f"{dec.prompts} prompts x {dec.max_new_tokens} tokens): {arms}")
    if line := fell_back_line(profile.timed_arms(), "times"):
        lines.append(f"  {line}")
    return lines
