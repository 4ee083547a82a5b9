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
  speculative loops like for like;
- given the main job's trained DFlash head, that head in both engines (`peer_dflash`: vLLM runs
  it exported to its `dflash` format), tiny world, batch 1.

Each shape runs once per forward path, the two engines like for like (`--paths`): `fast`, our
compiled fast path (`decoding.fast_path: true`) beside vLLM's compiled graphs (as shipped), and
`eager`, our eager path beside vLLM with `enforce_eager`. Each side is timed by the host's
monotonic clock around the same work, in its own process: ours around `decode` /
`decode_many`, vLLM's in its side process from its first request added to its last finished
(`Generated.seconds`), so the pipe between the processes is in neither. Compilation and warm-up
run before any timed pass. The job writes `peer.json` (`PeerTable`) and `peer.md`; the
benchmark's report shows the table when `<out root>/peer/` exists.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel

from peftbd.benchmarking.interleaved import interleaved_timing
from peftbd.benchmarking.peer_dflash import dflash_pair
from peftbd.benchmarking.peer_runs import (
    OURS_DEVICE, arm_run, best, ours_steps, same_device, tokens_per_step, vllm_tokens_per_step)
from peftbd.benchmarking.peer_schema import ArmRun, PeerPath, PeerTable, ShapeRow
from peftbd.config import EMBEDDED_TINY, Config
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.decoding import SpeculativeDecoder, compare
from peftbd.decoding.clock import Clock
from peftbd.methods import DraftContext
from peftbd.methods.prompt_lookup import PromptLookupDrafter
from peftbd.models.architecture import build_model, resolve_architecture
from peftbd.benchmarking.environment import hardware_description, native_dtype
from peftbd.models.loading import DTYPES, eos_token_ids, load_tokenizer, load_verifier, model_dirs
from peftbd.peers.vllm_client import VllmPeer
from peftbd.peers.vllm_env import cpu_memory_share, vllm_python
from peftbd.peers.vllm_protocol import Generate, Generated, Load, NgramSpec

TINY, SHAPE = "tiny", "shape"
ShapeDtype = Literal["auto", "float32", "bfloat16"]
PATHS: tuple[PeerPath, ...] = ("fast", "eager")


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
    paths: tuple[PeerPath, ...] = Field(PATHS, min_length=1, description=(
        "forward paths, each a like-for-like pair: fast (our compiled fast path beside vLLM's "
        "compiled graphs), eager (our eager path beside vLLM's enforce_eager)"))
    shape_dtype: ShapeDtype = Field("auto", description=(
        "0.6B shape: both engines' dtype (auto: bfloat16 where this CPU runs it natively, "
        "AVX-512 BF16 or AMX, else float32)"))


DRAFT_ROOM = 64
"""Positions past a request's last token that vLLM's engines leave room for (a round's drafts)."""


def engine_load(model: PreTrainedModel, model_dir: str, dtype: str, prompts: list[list[int]],
                max_new_tokens: int, path: PeerPath, cfg: Config) -> Load:
    """vLLM's engine for `model` (saved in `model_dir`) decoding `prompts` on `path` (eager:
    `enforce_eager`): one request at once, its length room for the longest prompt's tokens and
    a drafted block past them (a position vLLM has no room for is never accepted)."""
    room = max(map(len, prompts)) + max_new_tokens + DRAFT_ROOM
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return Load(model_dir=model_dir, dtype=dtype, max_model_len=room, max_num_seqs=1,
                seed=cfg.training.seed, enforce_eager=path == "eager",
                memory_share=cpu_memory_share(weights))


def compare_shape(name: str, label: str, model: PreTrainedModel, model_dir: str, dtype: str,
                  eos: list[int], prompts: list[list[int]], max_new_tokens: int,
                  settings: PeerSettings, cfg: Config, path: PeerPath, log_dir: Path
                  ) -> tuple[ShapeRow, str]:
    """One shape on one forward path, every arm in turns (vLLM's in two side processes, their
    logs in `log_dir`); returns the row and vLLM's version."""
    pl = cfg.prompt_lookup
    ngram = NgramSpec(num_tokens=pl.num_tokens, min_ngram=pl.min_ngram, max_ngram=pl.max_ngram)
    load = engine_load(model, model_dir, dtype, prompts, max_new_tokens, path, cfg)
    with (VllmPeer(log_dir / f"vllm_ar_{name}_{path}.log") as peer_ar,
          VllmPeer(log_dir / f"vllm_ngram_{name}_{path}.log") as peer_ngram):
        ready = peer_ar.load(load.model_copy(update={"max_num_seqs": settings.batch_size}))
        same_device(ready.device)
        same_device(peer_ngram.load(load.model_copy(update={"ngram": ngram})).device)
        clock = Clock(torch.device(OURS_DEVICE))
        fast = path == "fast"
        ours_ar = SpeculativeDecoder(model, None, eos, max_new_tokens, fast_path=fast)
        drafter = PromptLookupDrafter(pl.num_tokens, pl.min_ngram, pl.max_ngram, occurrence="earliest")
        ours_pl = SpeculativeDecoder(model, drafter, eos, max_new_tokens, fast_path=fast)
        B = settings.batch_size

        def vllm(peer: VllmPeer, batch: list[list[int]]) -> Generated:
            return peer.generate(Generate(prompts=batch, max_tokens=max_new_tokens, stop_token_ids=eos))

        # warm-up: the batched pass, every prompt once on each arm, the batched pass again
        # (allocations, lazy init, and on the fast path every graph the timed passes run, at the
        # KV capacity they run at: a pool only grows, and a new capacity is a new graph)
        ours_ar.decode_many(prompts, B), vllm(peer_ar, prompts)
        for p in prompts:
            ours_ar.decode(p), ours_pl.decode(p), vllm(peer_ar, [p]), vllm(peer_ngram, [p])
        ours_ar.decode_many(prompts, B), vllm(peer_ar, prompts)
        warm = ours_ar.path.compiles + ours_pl.path.compiles
        arms: dict[str, Callable[[list[int]], Any]] = {
            "ours_ar": ours_ar.decode, "vllm_ar": lambda p: vllm(peer_ar, [p]),
            "ours_pl": ours_pl.decode, "vllm_ngram": lambda p: vllm(peer_ngram, [p])}
        runs: dict[str, list[ArmRun]] = {}
        for _ in range(settings.repeats):
            one, seconds = interleaved_timing(arms, prompts, 1, clock)
            # ours: our clock around each decode; vLLM: its side's clock around the same work
            secs = {k: sum(seconds[k][0]) for k in ("ours_ar", "ours_pl")} | {
                k: sum(o.seconds for o in one[k]) for k in ("vllm_ar", "vllm_ngram")}
            outputs = {k: [r.tokens for r in one[k]] for k in ("ours_ar", "ours_pl")} | {
                k: [o.outputs[0] for o in one[k]] for k in ("vllm_ar", "vllm_ngram")}
            count = {k: sum(map(len, v)) for k, v in outputs.items()}
            runs.setdefault("ours_ar_b1", []).append(
                arm_run(count["ours_ar"], secs["ours_ar"], None, *ours_steps(one["ours_ar"])))
            runs.setdefault("vllm_ar_b1", []).append(
                arm_run(count["vllm_ar"], secs["vllm_ar"], None, sum(o.steps for o in one["vllm_ar"])))
            runs.setdefault("ours_prompt_lookup", []).append(
                arm_run(count["ours_pl"], secs["ours_pl"], tokens_per_step(one["ours_pl"]),
                        *ours_steps(one["ours_pl"])))
            runs.setdefault("vllm_ngram", []).append(
                arm_run(count["vllm_ngram"], secs["vllm_ngram"],
                        vllm_tokens_per_step(one["vllm_ngram"], len(prompts)),
                        sum(o.steps for o in one["vllm_ngram"])))
            start, before = clock.now(), ours_ar.verifier_steps  # batch B: the arms take turns per pass
            got = [r.tokens for r in ours_ar.decode_many(prompts, B)]
            runs.setdefault(f"ours_ar_b{B}", []).append(
                arm_run(sum(map(len, got)), clock.now() - start, None, ours_ar.verifier_steps - before))
            batched = vllm(peer_ar, prompts)
            runs.setdefault(f"vllm_ar_b{B}", []).append(
                arm_run(sum(map(len, batched.outputs)), batched.seconds, None, batched.steps))
        found = [m for k, (p, a, b) in enumerate(zip(prompts, outputs["ours_ar"], outputs["vllm_ar"]))
                 if (m := compare(model, f"{name}-{k}", p, a, b))]
        same_ngram = sum(a == b for a, b in zip(outputs["ours_pl"], outputs["vllm_ngram"]))
        row = ShapeRow(shape=name, model=label, dtype=dtype, path=path,
                       compiled_in_timed=ours_ar.path.compiles + ours_pl.path.compiles - warm,
                       ours_compiled=ours_ar.path.compiled, vllm_compiled=not load.enforce_eager,
                       prompts=len(prompts), max_new_tokens=max_new_tokens,
                       batch_size=B, arms={k: best(v) for k, v in runs.items()},
                       identical=len(prompts) - len(found), mismatches=found,
                       ngram_identical=same_ngram, vllm_load_s=ready.load_s)
        return row, ready.vllm_version


def run(cfg: Config, settings: PeerSettings, log_dir: Path,
        dflash: tuple[Path, Path] | None = None) -> PeerTable:
    """Every shape's row, our engine and vLLM taking turns; with `dflash` (a DFlash training
    run's output, where its vLLM export goes), that head in both engines on the tiny world
    (`peer_dflash`)."""
    vllm_python()  # VllmAbsent, with the install command, before anything is loaded
    torch.set_num_threads(1)
    cpu = torch.device(OURS_DEVICE)
    tokenizer = load_tokenizer(cfg)
    prompts = first_prompts(tokenizer, resolve_source(cfg, EMBEDDED_TINY), settings.prompts,
                            cfg.data.max_prompt_len)
    rows, version = [], ""
    verifier = load_verifier(cfg, cpu)
    eos, model_dir = eos_token_ids(verifier, tokenizer), model_dirs(cfg)[1]
    for path in settings.paths:
        row, version = compare_shape(
            TINY, cfg.model.name_or_path, verifier, model_dir, cfg.model.dtype, eos, prompts,
            settings.max_new_tokens, settings, cfg, path, log_dir)
        rows.append(row)
    pair = None
    if dflash is not None:
        path = settings.paths[0]
        ctx = DraftContext(cfg, verifier, tokenizer.mask_token_id, tokenizer.pad_token_id)
        load = engine_load(verifier, model_dir, cfg.model.dtype, prompts, settings.max_new_tokens,
                           path, cfg)
        with VllmPeer(log_dir / "vllm_dflash.log") as peer:
            pair = dflash_pair(ctx, *dflash, load, prompts, eos, settings.max_new_tokens,
                               settings.repeats, peer, path)
    del verifier
    if settings.shape:
        arch = resolve_architecture(cfg)
        torch.manual_seed(cfg.training.seed)
        dtype = native_dtype(cpu) if settings.shape_dtype == "auto" else settings.shape_dtype
        model = build_model(arch, DTYPES[dtype], cpu, cfg.model.attn_implementation)
        with tempfile.TemporaryDirectory(prefix="peftbd-peer-") as ckpt:
            model.save_pretrained(ckpt)  # one checkpoint both engines decode
            for path in settings.paths:
                row, _ = compare_shape(
                    SHAPE, f"{arch.name} ({arch.weights})", model, ckpt, dtype,
                    [int(arch.config.eos_token_id)], prompts[:settings.shape_prompts],
                    settings.shape_max_new_tokens, settings, cfg, path, log_dir)
                rows.append(row)
    pl = cfg.prompt_lookup
    return PeerTable(vllm_version=version, device=OURS_DEVICE, hardware=hardware_description(cpu), threads=1,
                     ngram=NgramSpec(num_tokens=pl.num_tokens, min_ngram=pl.min_ngram,
                                     max_ngram=pl.max_ngram), rows=rows, dflash=pair)
