"""Independent references for the benchmark's greedy audit. The audit compares every arm with AR
decoded by the same engine (the same prefill, verify and cache code), so a bug every arm shares
would still read "exact". Here AR's batch-1 outputs on a sample of prompts (the first
`decoding.reference_prompts` of the first timing shard's) are checked token for token against
engines that share none of that code: HF `generate` (always) and vLLM
(`decoding.reference_engines` names it and it is installed: `scripts/install.sh --with-vllm`;
else the check says why it did not run). Where they
differ, the mismatch carries the verifier's top-2 logit margin at the first differing position:
a near tie explains a difference in float arithmetic, a wide margin is a bug."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from peftbd.benchmarking.prompts import Prompt
from peftbd.config import RANDOM_WEIGHTS, Config
from peftbd.decoding import Mismatch, compare
from peftbd.decoding.verify import model_device
from peftbd.models.loading import model_dirs
from peftbd.peers.vllm_env import VllmAbsent, vllm_python

HF_GENERATE = "hf_generate"
VLLM = "vllm"


@dataclass(frozen=True)
class ReferenceCheck:
    """AR's outputs against one reference engine's on `checked` prompts: where they differ
    (empty: identical on all), or `absent`, why the engine did not run."""

    engine: str
    checked: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    absent: str | None = None
    version: str = ""

    @property
    def identical(self) -> int:
        return self.checked - len(self.mismatches)


@torch.inference_mode()
def hf_generate(verifier: PreTrainedModel, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                eos_ids: Sequence[int], pad_id: int) -> list[list[int]]:
    """HF `generate(do_sample=False)`, one prompt at a time, EOS kept as the engine keeps it."""
    device = model_device(verifier)
    outputs = []
    for ids in prompts:
        x = torch.tensor([list(ids)], device=device)
        out = verifier.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                                max_new_tokens=max_new_tokens, eos_token_id=list(eos_ids),
                                pad_token_id=pad_id)
        outputs.append(out[0, x.shape[1]:].tolist())
    return outputs


def vllm_generate(cfg: Config, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  eos_ids: Sequence[int]) -> tuple[list[list[int]], str]:
    """vLLM's greedy outputs of the verifier's checkpoint (one thread, prompts one at a time,
    eager) and vLLM's version; VllmAbsent where vLLM or a checkpoint on disk is missing."""
    from peftbd.peers.vllm_client import VllmPeer
    from peftbd.peers.vllm_protocol import Generate, Load

    _, source = model_dirs(cfg)
    if source.startswith(RANDOM_WEIGHTS):
        raise VllmAbsent(f"the verifier is {source} (random weights, no checkpoint for vLLM to load)")
    vllm_python()
    longest = max(len(p) for p in prompts) + max_new_tokens
    with VllmPeer() as peer:
        ready = peer.load(Load(model_dir=source, dtype=cfg.model.dtype, max_model_len=longest,
                               max_num_seqs=1, seed=cfg.training.seed,
                               enforce_eager=True))  # outputs only: no graphs to compile first
        out = peer.generate(Generate(prompts=[list(p) for p in prompts], max_tokens=max_new_tokens,
                                     stop_token_ids=list(eos_ids)))
    return out.outputs, ready.vllm_version


def reference_checks(cfg: Config, verifier: PreTrainedModel, eos_ids: Sequence[int], pad_id: int,
                     prompts: Sequence[Prompt], ar_outputs: Sequence[Sequence[int]],
                     max_new_tokens: int) -> list[ReferenceCheck]:
    """One check per engine of `decoding.reference_engines` over the first
    `decoding.reference_prompts` of `prompts` (AR's outputs in the same order)."""
    sample = list(zip(prompts, ar_outputs))[:cfg.decoding.reference_prompts]
    ids = [p.prompt_ids for p, _ in sample]
    checks = []
    for engine in cfg.decoding.reference_engines:
        version = ""
        try:
            if engine == HF_GENERATE:
                theirs = hf_generate(verifier, ids, max_new_tokens, eos_ids, pad_id)
            else:
                theirs, version = vllm_generate(cfg, ids, max_new_tokens, eos_ids)
        except VllmAbsent as exc:  # where it was to run: the timing worker's node
            checks.append(ReferenceCheck(engine, absent=f"on node {platform.node()}: {exc}"))
            continue
        found = [m for (p, ours), other in zip(sample, theirs)
                 if (m := compare(verifier, p.id, p.prompt_ids, ours, other))]
        checks.append(ReferenceCheck(engine, len(sample), found, version=version))
    return checks
