"""What a benchmark was measured on, read at run time where the timing runs."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch
import transformers


def _cpuinfo(field: str) -> str | None:
    """The first `field` line's value in /proc/cpuinfo (None where there is none)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.split(":", 1)[0].strip() == field:
                return line.split(":", 1)[1].strip()
    return None


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_bf16_feature() -> str | None:
    """The instructions this CPU runs bf16 matmuls with natively (AMX or AVX-512 BF16), or None
    (bf16 is then emulated in fp32 and slower than fp32)."""
    flags = set((_cpuinfo("flags") or "").split())
    return next((f for f in ("amx_bf16", "avx512_bf16") if f in flags), None)


def native_dtype(device: torch.device) -> str:
    """The dtype the paper's forwards run at where this device runs it natively: bfloat16 on a
    GPU or a CPU with `cpu_bf16_feature`, else float32."""
    return "bfloat16" if device.type == "cuda" or cpu_bf16_feature() else "float32"


def hardware_description(device: torch.device) -> str:
    """The GPU (name, memory) or CPU (model, cores, torch threads, how it runs bf16) the timing
    runs on."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB)"
    return (f"CPU {_cpu_model()} ({os.cpu_count()} cores, "
            f"torch threads: {torch.get_num_threads()}, "
            f"bf16: {cpu_bf16_feature() or 'emulated, no native instructions'})")


def engine_description(attn_implementation: str) -> str:
    """This project's decode loop and the library versions and attention kernel under it."""
    return (f"peftbd decode loop (transformers {transformers.__version__}, "
            f"torch {torch.__version__}, {attn_implementation} attention)")
