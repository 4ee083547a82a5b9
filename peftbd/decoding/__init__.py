"""The decoding engine: one Drafter interface, one verify-and-accept step, one loop.

    from peftbd.decoding import decode, PeftBDDrafter, MTPDrafter, BDHeadDrafter
    result = decode(model, prompt_ids, drafter, max_new_tokens=256, eos_ids=eos)
    result.tokens, result.rounds, result.metrics
    results = SpeculativeDecoder(model, drafter, eos, 256).decode_many(prompts, batch_size=16)
    sampled = decode(model, prompt_ids, drafter, 256, eos, SamplingParams(temperature=0.7, seed=1))

Batch 1 and batch B are one code path: every call steps a list of requests, each with its own
row of a ragged KV cache (`peftbd.decoding.ragged`).
"""

from peftbd.decoding.audit import Mismatch, audit_summary, compare, greedy_audit
from peftbd.decoding.bd_head_drafter import BDHeadDrafter
from peftbd.decoding.drafter import Drafter, NoDrafter
from peftbd.decoding.loop import SpeculativeDecoder, decode, result_of
from peftbd.decoding.metrics import DecodeResult, summarize
from peftbd.decoding.mtp_drafter import MTPDrafter
from peftbd.decoding.peft_bd_drafter import PeftBDDrafter
from peftbd.decoding.sampling import SamplingParams
from peftbd.decoding.state import DecodeState, RoundMetrics
from peftbd.decoding.ragged import RaggedKV, RowCache
from peftbd.decoding.verify import (
    VerifyResult,
    advance,
    advance_rows,
    advance_shipped,
    new_state,
    prefill,
    prefill_rows,
    verify,
    verify_rows,
)

__all__ = [
    "BDHeadDrafter", "DecodeResult", "DecodeState", "Drafter", "MTPDrafter", "Mismatch", "NoDrafter",
    "PeftBDDrafter", "RaggedKV", "RoundMetrics", "RowCache", "SamplingParams", "SpeculativeDecoder",
    "VerifyResult", "advance", "advance_rows", "advance_shipped", "audit_summary", "compare",
    "decode", "greedy_audit", "new_state", "prefill", "prefill_rows", "result_of", "summarize",
    "verify", "verify_rows",
]
