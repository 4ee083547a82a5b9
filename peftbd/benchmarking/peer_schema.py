"""peer.json: our engine beside vLLM (`peftbd.benchmarking.peer` writes it; the report reads it)."""

from __future__ import annotations

from pydantic import BaseModel

from peftbd.decoding.audit import Mismatch
from peftbd.peers.vllm_protocol import NgramSpec


class ArmRun(BaseModel):
    """One arm's timed pass: tok/s (best repeat), new tokens, seconds, tokens per verifier step."""

    tokens_per_s: float
    new_tokens: int
    seconds: float
    tokens_per_step: float | None = None


class ShapeRow(BaseModel):
    """One shape's comparison."""

    shape: str
    model: str
    prompts: int
    max_new_tokens: int
    batch_size: int
    arms: dict[str, ArmRun]  # ours_ar_b1, vllm_ar_b1, ours_ar_bB, vllm_ar_bB, ours_prompt_lookup, vllm_ngram
    identical: int  # prompts whose AR outputs (batch 1) are equal token for token
    mismatches: list[Mismatch]
    ngram_identical: int  # prompts whose prompt-lookup and ngram outputs are equal
    vllm_load_s: float


class PeerTable(BaseModel):
    """peer.json."""

    vllm_version: str
    device: str
    threads: int
    fast_path: bool
    vllm_eager: bool
    ngram: NgramSpec
    rows: list[ShapeRow]
