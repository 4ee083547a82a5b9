"""What a benchmark was measured on, read at run time where the timing runs."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch
import transformers


def _cpu_model() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def hardware_description(device: torch.device) -> str:
    """The GPU (name, memory) or CPU (model, cores, torch threads) the timing runs on."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB)"
    return (f"CPU {_cpu_model()} ({os.cpu_count()} cores, "
            f"torch threads: {torch.get_num_threads()})")


def engine_description(attn_implementation: str) -> str:
    """This project's decode loop and the library versions and attention kernel under it."""
    return (f"peftbd decode loop (transformers {transformers.__version__}, "
            f"torch {torch.__version__}, {attn_implementation} attention)")
