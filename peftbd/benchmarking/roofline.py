"""A roofline bound for one named GPU: a forward takes at least max(bytes / HBM bandwidth,
FLOPs / dense bf16 peak). It ignores kernel launches and framework time, which is what the paper's
HF-loop timings are full of; it says what a round costs where only the hardware limits it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from peftbd.config_sections import RooflineGPU

if TYPE_CHECKING:
    from peftbd.benchmarking.forward_counter import ForwardCount

BF16_BYTES = 2


@dataclass(frozen=True)
class GPU:
    """A GPU's datasheet figures: HBM bytes/s and dense bf16 FLOP/s (no sparsity)."""

    name: str
    hbm_bytes_per_s: float
    bf16_flops_per_s: float


GPUS: dict[str, GPU] = {
    "H200": GPU("H200", 4.8e12, 989e12),  # SXM: 4.8 TB/s HBM3e, ~989 dense bf16 TFLOPS
    "H100": GPU("H100", 3.35e12, 989e12),  # SXM: 3.35 TB/s HBM3
}
assert set(GPUS) == set(get_args(RooflineGPU)), "config.RooflineGPU and GPUS must list the same GPUs"


def forward_seconds(count: ForwardCount, gpu: GPU) -> float:
    """The roofline time of one forward with its weights and KV in bf16."""
    return max(count.bytes_at(BF16_BYTES) / gpu.hbm_bytes_per_s, count.flops / gpu.bf16_flops_per_s)


def phase_ms(forwards: Sequence[ForwardCount], gpu: GPU) -> float:
    """The roofline milliseconds of a phase's forwards, run one after another."""
    return 1e3 * sum(forward_seconds(f, gpu) for f in forwards)
