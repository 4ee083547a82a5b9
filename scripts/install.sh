#!/usr/bin/env bash
# Install what is missing, into the current Python environment (activate a venv first if you
# want one): torch (the CPU build where there is no NVIDIA GPU, so a CPU box never pulls the
# multi-GB CUDA build), then DeepSpeed (an sdist that must see torch at build time), then this
# project with its dev extra. Idempotent: a second run installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pipi() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[install] NVIDIA GPU found: installing the CUDA build of torch"
    pipi "torch>=2.5,<2.15"
  else
    echo "[install] no NVIDIA GPU: installing the CPU build of torch 2.13.0"
    # A local wheel (find-links) if the machine has one, else PyTorch's CPU wheel index.
    pipi "torch==2.13.0+cpu" 2>/dev/null \
      || pipi "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu
  fi
fi
has() { "$PY" -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('$1') else 1)"; }
if ! has deepspeed; then
  echo "[install] building DeepSpeed against the installed torch"
  pipi setuptools wheel packaging
  # No ops ahead of time, except on a machine without an NVIDIA GPU the shared-memory
  # allreduce op every CPU training worker loads (else each new cache JIT-builds it, ~30 s).
  shm=1
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then shm=0; fi
  # (--no-cache-dir: a wheel cached by a build with other DS_BUILD_* settings would be reused)
  DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=$shm pipi --no-build-isolation --no-cache-dir "deepspeed>=0.16,<1"
fi
here=$PWD
# Where peftbd is installed from, printed only when every requirement pyproject.toml declares
# (its dependencies and the dev extra) is installed in a version it allows; anything else
# (a requirement added since the last install, a Python without tomllib) reinstalls.
requirements_met_at() {
  cd / && "$PY" - "$here/pyproject.toml" <<'PYEOF'
import importlib.metadata as md, importlib.util as u, os, sys, tomllib
from packaging.requirements import Requirement
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
for line in project["dependencies"] + project["optional-dependencies"]["dev"]:
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate({"extra": "dev"}):
        assert req.specifier.contains(md.version(req.name), prereleases=True), line
print(os.path.dirname(os.path.dirname(u.find_spec("peftbd").origin)))
PYEOF
}
installed_at=$(requirements_met_at 2>/dev/null || true)
if [ "$installed_at" != "$here" ]; then
  echo "[install] installing peftbd and its dependencies"
  pipi -e ".[dev]"
fi
echo "[install] ready: $("$PY" -c 'from importlib.metadata import version as v
print(", ".join(f"{p} {v(p)}" for p in ("torch", "ray", "transformers", "peft", "deepspeed")))')"
