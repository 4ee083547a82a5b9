"""DFlash in vLLM beside DFlash in our engine: the main job's trained DFlash head, exported to
vLLM's `dflash` format (`peftbd.peers.dflash_export`), drafts in both engines on the same prompts
at batch 1, one thread each, the two taking turns per prompt, greedy.

Both draft the same blocks from the same weights, so they must accept alike: vLLM's tokens per
verifier step must fall inside our engine's 95% interval over the prompts
(`peftbd.benchmarking.noise.acceptance_interval`), and both outputs are greedy AR's, so each
prompt's two outputs must be equal. tok/s compares the two engines' speculative loops with one
drafter.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from peftbd.benchmarking.interleaved import interleaved_timing
from peftbd.benchmarking.noise import acceptance_interval
from peftbd.benchmarking.peer_runs import (
    arm_run, best, ours_steps, same_device, tokens_per_step, vllm_tokens_per_step)
from peftbd.benchmarking.peer_schema import ArmRun, DflashPair, PeerPath
from peftbd.decoding import DecodeResult, SpeculativeDecoder
from peftbd.decoding.clock import Clock
from peftbd.methods import DraftContext
from peftbd.methods.dflash import METHOD as DFLASH
from peftbd.models.bd_head import BDHead
from peftbd.peers.dflash_export import export_dflash
from peftbd.peers.vllm_client import VllmPeer
from peftbd.peers.vllm_protocol import DflashSpec, Generate, Generated, Load


def dflash_pair(ctx: DraftContext, head_dir: Path, export_dir: Path, load: Load,
                prompts: list[list[int]], eos: list[int], max_new_tokens: int, repeats: int,
                peer: VllmPeer, path: PeerPath) -> DflashPair:
    """Export the head in `head_dir` (a DFlash training run's output) to `export_dir`, load it in
    `peer` (vLLM, with `load`'s engine settings: `engine_load`'s for `path`) and time both
    engines' DFlash on `prompts` (ours on `path` too; each side by its own clock around the same
    work, as in `peftbd.benchmarking.peer`)."""
    head = DFLASH.load(ctx, head_dir)
    assert isinstance(head, BDHead)
    exported = export_dflash(head, ctx.cfg.dflash.block_size, export_dir, DFLASH.id)
    drafter = DflashSpec(model_dir=str(exported.model_dir), num_tokens=exported.num_speculative_tokens)
    same_device(peer.load(load.model_copy(update={"max_num_seqs": 1, "dflash_drafter": drafter})).device)
    [arm] = DFLASH.arms(ctx.cfg)
    ours = SpeculativeDecoder(ctx.verifier, DFLASH.drafter(head, ctx, arm), eos, max_new_tokens,
                              fast_path=path == "fast")

    def vllm(ids: list[int]) -> Generated:
        return peer.generate(Generate(prompts=[ids], max_tokens=max_new_tokens, stop_token_ids=eos))

    for p in prompts:  # warm-up (on the fast path: every graph compiled before the timed pass)
        ours.decode(p), vllm(p)
    arms: dict[str, Callable[[list[int]], Any]] = {"ours": ours.decode, "vllm": vllm}
    clock = Clock(torch.device("cpu"))
    runs: dict[str, list[ArmRun]] = {"ours": [], "vllm": []}
    results: list[DecodeResult] = []
    generated: list[Generated] = []
    for _ in range(repeats):
        got, seconds = interleaved_timing(arms, prompts, 1, clock)
        results, generated = got["ours"], got["vllm"]
        runs["ours"].append(arm_run(sum(len(r.tokens) for r in results), sum(seconds["ours"][0]),
                                    tokens_per_step(results), *ours_steps(results)))
        runs["vllm"].append(arm_run(sum(len(g.outputs[0]) for g in generated), sum(g.seconds for g in generated),
                                    vllm_tokens_per_step(generated, len(prompts)),
                                    sum(g.steps for g in generated)))
    return DflashPair(
        head_dir=str(head_dir), path=path, export_subdir=exported.model_dir.name,
        num_speculative_tokens=exported.num_speculative_tokens,
        target_layer_ids=list(exported.target_layer_ids), ours=best(runs["ours"]),
        vllm=best(runs["vllm"]), ours_interval=acceptance_interval([results]),
        identical=sum(r.tokens == g.outputs[0] for r, g in zip(results, generated)),
        prompts=len(prompts),
        ours_accepted_per_position=[sum(r.accepted >= j for res in results for r in res.rounds)
                                    for j in range(1, exported.num_speculative_tokens + 1)],
        vllm_accepted_per_position=[sum(col) for col in
                                    zip(*(g.accepted_per_position or [] for g in generated))])
