"""The README's local blocks run exactly as printed, in order, in one shell: `ray start --head`
with token auth, `serve deploy serve_apps/local.yaml`, the openai request, `ray job submit`, then
`serve shutdown` and `ray stop`.

They use Ray's fixed ports (6379, 8265, 8000, 8080), Ray's default temp dir (/tmp/ray, where
`ray start` leaves the address that a bare `ray.init()` then joins) and `ray stop` stops every
Ray process it can see, so they run in private namespaces (`unshare`): network (loopback only),
processes, and a mount of their own directory over /tmp/ray. Nothing else on the machine
collides with their ports, joins their cluster or is stopped. A fresh HOME holds the auth token
the first block generates."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from peftbd.config import PRESETS, cache_root

REPO = Path(__file__).resolve().parents[1]
NAMESPACE = ["unshare", "--map-root-user", "--net", "--pid", "--fork", "--mount-proc"]


def readme_blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block of the README, in order."""
    return re.findall(r"^```(\w+)\n(.*?)^```", (REPO / "README.md").read_text(), re.M | re.S)


def local_serving_blocks() -> list[tuple[str, str]]:
    """The serving section's blocks: from the one that starts Ray to the one that stops it."""
    blocks = readme_blocks()
    start = next(i for i, (_, b) in enumerate(blocks) if "ray start --head" in b)
    end = next(i for i, (_, b) in enumerate(blocks) if "ray stop" in b)
    return blocks[start: end + 1]


def _namespaces_allowed() -> str | None:
    """None where this user may make the namespaces, else why not."""
    if not shutil.which("unshare"):
        return "no `unshare` on PATH (util-linux)"
    tried = subprocess.run([*NAMESPACE, "true"], capture_output=True, text=True)
    return None if tried.returncode == 0 else f"`unshare` refused: {tried.stderr.strip()}"


def _script(blocks: list[tuple[str, str]], python_block: Path, ray_temp: Path) -> str:
    """One shell session: each bash block as printed; the python block through this interpreter;
    between the deploy and the request, `serve status` until both apps run (as the README says).
    First the namespaces' set-up: loopback up, `ray_temp` mounted over /tmp/ray."""
    lines = ["set -euo pipefail", "ip link set lo up",
             f"mkdir -p /tmp/ray && mount --bind {ray_temp} /tmp/ray"]
    for language, text in blocks:
        if language == "python":
            lines.append(f"{sys.executable} {python_block}")
            continue
        lines.append(text)
        if "serve deploy" in text:
            lines.append("for _ in $(seq 300); do serve status | grep -q DEPLOY_FAILED && exit 3; "
                         "[ \"$(serve status | grep -c 'status: RUNNING')\" = 2 ] && break; sleep 3; done")
    return "\n".join(lines) + "\n"


@pytest.mark.integration
@pytest.mark.slow  # a Ray head, both apps deployed, a submitted job (~2.5 min)
def test_the_readmes_local_blocks_run_as_printed_with_token_auth(tmp_path, tiny_world):
    why = _namespaces_allowed()
    if why:
        pytest.skip(f"the README's fixed ports need a private network namespace: {why}")
    blocks = local_serving_blocks()
    assert [lang for lang, _ in blocks] == ["bash", "python", "bash"]
    python_block = tmp_path / "request.py"
    python_block.write_text(blocks[1][1] + "print('answered')\n")  # it raises unless answered
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # a fresh shell
    (tmp_path / "home").mkdir()
    env.update(HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1",  # the world where it is built
               PEFTBD_CACHE=str(cache_root(PRESETS["tiny"]["paths"]["cache_dir"])))
    (tmp_path / "ray").mkdir()
    ran = subprocess.run([*NAMESPACE, "bash", "-c", _script(blocks, python_block, tmp_path / "ray")],
                         cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=1200)
    out = ran.stdout + ran.stderr
    assert ran.returncode == 0, out[-5000:]
    assert (tmp_path / "home" / ".ray" / "auth_token").is_file()  # the first line made it
    assert "\nanswered\n" in out, out[-3000:]
    assert "[pipeline] plan for" in out and re.search(r"Job 'raysubmit_\w+' succeeded", out), out[-3000:]
    assert "Stopped all" in out  # `ray stop`, within the namespace
    assert list((tmp_path / "ray").glob("session_*")), "Ray's session was not in the private /tmp/ray"
