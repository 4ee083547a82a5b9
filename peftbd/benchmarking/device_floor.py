"""The floor of a forward on the device it ran on: max(bytes read / memory bandwidth, FLOPs /
matmul throughput), the same bound as the GPU roofline (`peftbd.benchmarking.roofline`) but for
whatever device measured it, so "x over floor" says how much of a measured time is the algorithm's
arithmetic and memory traffic and how much is the stack (kernel launches, Python, framework).

A GPU named in `peftbd.benchmarking.roofline.GPUS` uses its datasheet (bf16); any other device
(a CPU) is measured here: the best of a few square matmuls at the timed dtype, and the best of a
few large tensor copies (read + write counted)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from peftbd.benchmarking.cost_profile_schema import DeviceFloor
from peftbd.benchmarking.roofline import BF16_BYTES, GPUS
from peftbd.decoding.clock import Clock

GEMM_N = {"cpu": 1024, "cuda": 8192}
COPY_BYTES = 256 << 20
TRIES = 5


def _best_seconds(fn: Callable[[], object], clock: Clock) -> float:
    best = float("inf")
    for _ in range(TRIES):
        start = clock.now()
        fn()
        best = min(best, clock.now() - start)
    return best


def measure_floor(device: torch.device, dtype: torch.dtype, hardware: str = "") -> DeviceFloor:
    """The datasheet floor of a GPU in `GPUS` named in `hardware` at bf16, else one measured on
    `device` at `dtype` (a second or two)."""
    name = str(dtype).removeprefix("torch.")
    gpu = next((g for g in GPUS.values() if g.name in hardware), None)
    if device.type == "cuda" and gpu is not None and dtype.itemsize == BF16_BYTES:
        return DeviceFloor(str(device), name, gpu.hbm_bytes_per_s, gpu.bf16_flops_per_s,
                           f"{gpu.name} datasheet")
    n = GEMM_N.get(device.type, GEMM_N["cpu"])
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    src = torch.empty(COPY_BYTES // dtype.itemsize, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    with torch.inference_mode():
        a @ b, dst.copy_(src)  # warm-up
        gemm = _best_seconds(lambda: a @ b, Clock(device))
        copy = _best_seconds(lambda: dst.copy_(src), Clock(device))
    return DeviceFloor(str(device), name, 2 * COPY_BYTES / copy, 2 * n ** 3 / gemm,
                       f"measured: best of {TRIES} {n}x{n} matmuls and {COPY_BYTES >> 20} MiB "
                       f"copies, torch threads: {torch.get_num_threads()}")
