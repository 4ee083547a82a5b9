"""peer.json: our engine beside vLLM (`peftbd.benchmarking.peer` writes it; the report reads it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, computed_field

from peftbd.decoding.audit import Mismatch
from peftbd.peers.vllm_protocol import NgramSpec


PeerPath = Literal["fast", "eager"]
"""A like-for-like pair of forward paths: fast (our compiled fast path, vLLM's compiled graphs)
or eager (our eager path, vLLM's `enforce_eager`)."""


class ArmRun(BaseModel):
    """One arm's timed pass (the best repeat): tok/s, new tokens, seconds, tokens per verifier
    step; its engine steps (each one verifier forward over the running requests, a prefill
    included) and ms per step; ours also the ms of a step's forwards (the rest is host time)."""

    tokens_per_s: float
    new_tokens: int
    seconds: float
    tokens_per_step: float | None = None
    steps: int | None = None
    ms_per_step: float | None = None
    forward_ms_per_step: float | None = None


class ShapeRow(BaseModel):
    """One shape's comparison on one forward path (`ours_compiled` / `vllm_compiled`: what ran)."""

    shape: str
    model: str
    dtype: str
    path: PeerPath
    ours_compiled: bool
    vllm_compiled: bool
    compiled_in_timed: int = 0  # our graphs compiled inside a timed pass (0: none timed)
    prompts: int
    max_new_tokens: int
    batch_size: int
    arms: dict[str, ArmRun]  # ours_ar_b1, vllm_ar_b1, ours_ar_bB, vllm_ar_bB, ours_prompt_lookup, vllm_ngram
    identical: int  # prompts whose AR outputs (batch 1) are equal token for token
    mismatches: list[Mismatch]
    ngram_identical: int  # prompts whose prompt-lookup and ngram outputs are equal
    vllm_load_s: float


class DflashPair(BaseModel):
    """The main job's DFlash head drafting in both engines (`peftbd.benchmarking.peer_dflash`):
    its training output, the vLLM export (a directory beside peer.json), each engine's batch-1
    pass, our tokens per step's 95% interval over the prompts and whether vLLM's falls inside it,
    and the prompts whose two outputs are equal."""

    head_dir: str
    path: PeerPath
    export_subdir: str
    num_speculative_tokens: int
    target_layer_ids: list[int]
    ours: ArmRun
    vllm: ArmRun
    ours_interval: tuple[float, float] | None
    identical: int
    prompts: int
    ours_accepted_per_position: list[int]  # rounds whose draft position j was accepted
    vllm_accepted_per_position: list[int]  # vLLM's count (it also counts drafts past the budget)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def within(self) -> bool | None:
        """vLLM's tokens per verifier step inside our interval (None: either is missing)."""
        theirs = self.vllm.tokens_per_step
        if self.ours_interval is None or theirs is None:
            return None
        return self.ours_interval[0] <= theirs <= self.ours_interval[1]


class PeerTable(BaseModel):
    """peer.json."""

    vllm_version: str
    device: str
    hardware: str = ""  # the CPU, and how it runs bf16 (`environment.hardware_description`)
    threads: int
    ngram: NgramSpec
    rows: list[ShapeRow]
    dflash: DflashPair | None = None
    dflash_absent: str | None = None  # why there is no DFlash pair (no trained head found)
