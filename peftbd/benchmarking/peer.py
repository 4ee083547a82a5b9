"""The peer table: our engine beside vLLM, measured in one run (library only, no Ray; the job is
`python -m jobs.peer`, vLLM from `bash scripts/install.sh --with-vllm`).

Per shape (the tiny world's verifier; the cost profile's architecture, Qwen3-0.6B, with random
weights written once to disk so that both engines load the same checkpoint), on the same prompts,
one thread each (our process and vLLM's side process), greedy, EOS honoured:

- AR at batch 1 (one prompt at a time, the arms taking turns per prompt) and at batch B
  (continuous batching, at most B at once, the arms taking turns per pass): tok/s, ours and
  vLLM's, and every output compared token for token (a difference carries the verifier's top-2
  margin at its first position: a near tie is float arithmetic, a wide margin a bug);
- prompt lookup beside vLLM's `ngram` at batch 1, with the same n-gram settings and vLLM's
  occurrence rule (the earliest match: `prompt_lookup.occurrence=earliest`), so both propose the
  same drafts: tokens per verifier step must agree, and tok/s compares the two engines'
  speculative loops like for like.

Both engines run as shipped: ours with the config's `decoding.fast_path`, vLLM with its defaults
(on CPU its compiled graphs; `--vllm-eager` turns them off). The job writes `peer.json`
(`PeerTable`) and `peer.md`; the benchmark's report shows the table when `<out root>/peer/` exists.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel

from peftbd.benchmarking.interleaved import interleaved_timing
from peftbd.benchmarking.peer_schema import ArmRun, PeerTable, ShapeRow
from peftbd.config import EMBEDDED_TINY, Config
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.decoding import DecodeResult, SpeculativeDecoder, compare
from peftbd.decoding.clock import Clock
from peftbd.methods.prompt_lookup import PromptLookupDrafter
from peftbd.models.architecture import build_model, resolve_architecture
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier, model_dirs
from peftbd.peers.vllm_client import VllmPeer
from peftbd.peers.vllm_env import vllm_python
from peftbd.peers.vllm_protocol import Generate, Generated, Load, NgramSpec

TINY, SHAPE = "tiny", "shape"


class PeerSettings(BaseModel):
    """What the peer run decodes (its CLI flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: int = Field(16, ge=1, description="tiny: prompts per pass")
    max_new_tokens: int = Field(64, ge=1, description="tiny: new tokens per prompt at most")
    batch_size: int = Field(16, ge=2, description="the batched pass's B")
    shape_prompts: int = Field(4, ge=1, description="0.6B shape: prompts per pass")
    shape_max_new_tokens: int = Field(16, ge=1, description="0.6B shape: new tokens per prompt")
    repeats: int = Field(1, ge=1, description="timed repeats (each arm's best is reported)")
    shape: bool = Field(True, description="also run the cost profile's architecture")
    vllm_eager: bool = Field(False, description="vLLM without its compiled graphs")


def memory_share(model: PreTrainedModel, kv_bytes: int = 1 << 30) -> float:
    """vLLM's `gpu_memory_utilization` for `model` on this machine: on CPU the share of RAM that
    it reserves, which must hold the weights (twice: vLLM unties a tied LM head, and its memory
    profile counts a forward's peak) and the KV cache (`kv_bytes`)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return round(min(0.5, (2 * weights + kv_bytes) / ram), 4)


def _tokens_per_step(results: Sequence[DecodeResult]) -> float:
    """New tokens after each request's first (its prefill's) over its rounds (verifier steps)."""
    steps = sum(len(r.rounds) for r in results)
    return sum(len(r.tokens) - 1 for r in results) / steps if steps else 1.0


def _vllm_tokens_per_step(outs: Sequence[Generated], prompts: int) -> float | None:
    """The same for vLLM at batch 1: each request's first step is its prefill's."""
    steps = sum(o.request_steps for o in outs) - prompts
    tokens = sum(len(t) for o in outs for t in o.outputs) - prompts
    return tokens / steps if steps > 0 else None


VERIFIER_MODES = ("prefill", "verify")
"""Our forward modes that run the verifier (a model-free drafter's draft is host time)."""


def _run(tokens: int, seconds: float, per_step: float | None = None, steps: int | None = None,
         forward_s: float | None = None) -> ArmRun:
    ms = None if not steps else round(seconds / steps * 1e3, 4)
    fwd = None if not steps or forward_s is None else round(forward_s / steps * 1e3, 4)
    return ArmRun(tokens_per_s=round(tokens / seconds, 2), new_tokens=tokens,
                  seconds=round(seconds, 4), tokens_per_step=None if per_step is None else round(per_step, 4),
                  steps=steps, ms_per_step=ms, forward_ms_per_step=fwd)


def _ours_steps(results: Sequence[DecodeResult]) -> tuple[int, float]:
    """Batch 1: the verifier forwards of `results` (each one engine step) and their seconds."""
    return (sum(r.forward_calls.get(m, 0) for r in results for m in VERIFIER_MODES),
            sum(r.forward_seconds.get(m, 0.0) for r in results for m in VERIFIER_MODES))


def _best(runs: Sequence[ArmRun]) -> ArmRun:
    return max(runs, key=lambda r: r.tokens_per_s)


def compare_shape(name: str, label: str, model: PreTrainedModel, model_dir: str, dtype: str,
                  eos: list[int], prompts: list[list[int]], max_new_tokens: int,
                  settings: PeerSettings, cfg: Config, peer_ar: VllmPeer,
                  peer_ngram: VllmPeer) -> tuple[ShapeRow, str]:
    """One shape, every arm in turns; returns the row and vLLM's version."""
    pl = cfg.prompt_lookup
    longest = max(map(len, prompts)) + max_new_tokens
    ngram = NgramSpec(num_tokens=pl.num_tokens, min_ngram=pl.min_ngram, max_ngram=pl.max_ngram)
    common = dict(model_dir=model_dir, dtype=dtype, max_model_len=longest, seed=cfg.training.seed,
                  enforce_eager=settings.vllm_eager, memory_share=memory_share(model))
    ready = peer_ar.load(Load(max_num_seqs=settings.batch_size, **common))
    peer_ngram.load(Load(max_num_seqs=1, ngram=ngram, **common))
    clock = Clock(torch.device("cpu"))
    fast = cfg.decoding.fast_path
    ours_ar = SpeculativeDecoder(model, None, eos, max_new_tokens, fast_path=fast)
    drafter = PromptLookupDrafter(pl.num_tokens, pl.min_ngram, pl.max_ngram, occurrence="earliest")
    ours_pl = SpeculativeDecoder(model, drafter, eos, max_new_tokens, fast_path=fast)
    B = settings.batch_size

    def vllm(peer: VllmPeer, batch: list[list[int]]) -> Generated:
        return peer.generate(Generate(prompts=batch, max_tokens=max_new_tokens, stop_token_ids=eos))

    # warm-up: one prompt each, and one batched pass each (allocations, lazy init, graphs)
    ours_ar.decode(prompts[0]), ours_pl.decode(prompts[0]), vllm(peer_ar, prompts[:1]), vllm(peer_ngram, prompts[:1])
    ours_ar.decode_many(prompts[:B], B), vllm(peer_ar, prompts[:B])
    arms: dict[str, Callable[[list[int]], Any]] = {
        "ours_ar": ours_ar.decode, "vllm_ar": lambda p: vllm(peer_ar, [p]),
        "ours_pl": ours_pl.decode, "vllm_ngram": lambda p: vllm(peer_ngram, [p])}
    runs: dict[str, list[ArmRun]] = {}
    for _ in range(settings.repeats):
        one, seconds = interleaved_timing(arms, prompts, 1, clock)
        secs = {k: sum(v[0]) for k, v in seconds.items()}
        outputs = {k: [r.tokens for r in one[k]] for k in ("ours_ar", "ours_pl")} | {
            k: [o.outputs[0] for o in one[k]] for k in ("vllm_ar", "vllm_ngram")}
        count = {k: sum(map(len, v)) for k, v in outputs.items()}
        runs.setdefault("ours_ar_b1", []).append(
            _run(count["ours_ar"], secs["ours_ar"], None, *_ours_steps(one["ours_ar"])))
        runs.setdefault("vllm_ar_b1", []).append(
            _run(count["vllm_ar"], secs["vllm_ar"], None, sum(o.steps for o in one["vllm_ar"])))
        runs.setdefault("ours_prompt_lookup", []).append(
            _run(count["ours_pl"], secs["ours_pl"], _tokens_per_step(one["ours_pl"]),
                 *_ours_steps(one["ours_pl"])))
        runs.setdefault("vllm_ngram", []).append(
            _run(count["vllm_ngram"], secs["vllm_ngram"],
                 _vllm_tokens_per_step(one["vllm_ngram"], len(prompts)),
                 sum(o.steps for o in one["vllm_ngram"])))
        start, before = clock.now(), ours_ar.verifier_steps  # batch B: the arms take turns per pass
        got = [r.tokens for r in ours_ar.decode_many(prompts, B)]
        runs.setdefault(f"ours_ar_b{B}", []).append(
            _run(sum(map(len, got)), clock.now() - start, None, ours_ar.verifier_steps - before))
        start = clock.now()
        batched = vllm(peer_ar, prompts)
        runs.setdefault(f"vllm_ar_b{B}", []).append(
            _run(sum(map(len, batched.outputs)), clock.now() - start, None, batched.steps))
    found = [m for k, (p, a, b) in enumerate(zip(prompts, outputs["ours_ar"], outputs["vllm_ar"]))
             if (m := compare(model, f"{name}-{k}", p, a, b))]
    same_ngram = sum(a == b for a, b in zip(outputs["ours_pl"], outputs["vllm_ngram"]))
    row = ShapeRow(shape=name, model=label, prompts=len(prompts), max_new_tokens=max_new_tokens,
                   batch_size=B, arms={k: _best(v) for k, v in runs.items()},
                   identical=len(prompts) - len(found), mismatches=found,
                   ngram_identical=same_ngram, vllm_load_s=ready.load_s)
    return row, ready.vllm_version


def run(cfg: Config, settings: PeerSettings, log_dir: Path) -> PeerTable:
    """Every shape's row, our engine and vLLM taking turns."""
    vllm_python()  # VllmAbsent, with the install command, before anything is loaded
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(cfg)
    prompts = first_prompts(tokenizer, resolve_source(cfg, EMBEDDED_TINY), settings.prompts,
                            cfg.data.max_prompt_len)
    rows, version = [], ""
    verifier = load_verifier(cfg, torch.device("cpu"))
    with VllmPeer(log_dir / "vllm_ar.log") as peer_ar, VllmPeer(log_dir / "vllm_ngram.log") as peer_ngram:
        row, version = compare_shape(
            TINY, cfg.model.name_or_path, verifier, model_dirs(cfg)[1], cfg.model.dtype,
            eos_token_ids(verifier, tokenizer), prompts, settings.max_new_tokens, settings, cfg,
            peer_ar, peer_ngram)
    rows.append(row)
    del verifier
    if settings.shape:
        arch = resolve_architecture(cfg)
        torch.manual_seed(cfg.training.seed)
        model = build_model(arch, torch.float32, torch.device("cpu"), cfg.model.attn_implementation)
        with (tempfile.TemporaryDirectory(prefix="peftbd-peer-") as ckpt,
              VllmPeer(log_dir / "vllm_ar_shape.log") as peer_ar,
              VllmPeer(log_dir / "vllm_ngram_shape.log") as peer_ngram):
            model.save_pretrained(ckpt)  # one checkpoint both engines decode
            row, _ = compare_shape(
                SHAPE, f"{arch.name} ({arch.weights})", model, ckpt, "float32",
                [int(arch.config.eos_token_id)], prompts[:settings.shape_prompts],
                settings.shape_max_new_tokens, settings, cfg, peer_ar, peer_ngram)
        rows.append(row)
    pl = cfg.prompt_lookup
    return PeerTable(vllm_version=version, device="cpu", threads=1,
                     fast_path=cfg.decoding.fast_path, vllm_eager=settings.vllm_eager,
                     ngram=NgramSpec(num_tokens=pl.num_tokens, min_ngram=pl.min_ngram,
                                     max_ngram=pl.max_ngram), rows=rows)
