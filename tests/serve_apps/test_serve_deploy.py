"""`serve deploy serve_apps/<app>.yaml` on a local cluster started with `ray start --head` (token
auth on, loopback only), then an HTTP answer equal to the engine's. The cluster is this test's
own `ray start --block` process: stopping it stops exactly the Ray processes it started."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import openai
import pytest
import yaml

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APPS = Path(__file__).resolve().parents[2] / "serve_apps"
PROMPT = "Describe the for statement."


@pytest.fixture(scope="module")
def cluster(free_port):
    """(dashboard address, CLI env, HTTP port) of a fresh head node with a dashboard."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env.pop("RAY_ADDRESS", None)
    for attempt in range(3):  # on a loaded box the raylet may give up on its agents (15 s)
        proc, temp, address = _start_head(free_port, env)
        try:
            _wait(lambda: _serve(["status"], address, env).returncode == 0, 150, "the dashboard",
                  alive=proc)
            break
        except TimeoutError:
            _stop(proc, temp)
            if attempt == 2:
                raise
    try:
        yield address, env, free_port()
    finally:
        _stop(proc, temp)


def _start_head(free_port, env: dict) -> tuple[subprocess.Popen, str, str]:
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must fit
    dashboard = free_port()
    ports = {name: free_port() for name in (
        "port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
        "ray-client-server-port", "metrics-export-port", "runtime-env-agent-port")}
    cmd = ["ray", "start", "--head", "--block", f"--temp-dir={temp}", "--node-ip-address=127.0.0.1",
           "--num-cpus=4", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           "--disable-usage-stats", f"--dashboard-port={dashboard}",
           *[f"--{k}={v}" for k, v in ports.items()]]
    with open(Path(temp) / "ray_start.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, temp, f"http://127.0.0.1:{dashboard}"


def _stop(proc: subprocess.Popen, temp: str) -> None:
    """`ray start --block` drains and stops the processes it started on SIGTERM; whatever of its
    session is left (a failed start can leave some) is killed by pid."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(90)
    except subprocess.TimeoutExpired:
        pass
    ps = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    for pid, sid in (line.split() for line in ps.splitlines()):
        if int(sid) == proc.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    shutil.rmtree(temp, ignore_errors=True)


def _serve(args: list[str], address: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["serve", *args, "-a", address], env=env, capture_output=True,
                          text=True, timeout=300)


def _wait(ready, timeout_s: float, what: str, alive: subprocess.Popen | None = None) -> None:
    deadline = time.time() + timeout_s
    while not ready():
        if time.time() > deadline or (alive is not None and alive.poll() is not None):
            raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s")
        time.sleep(3)


@pytest.mark.parametrize("name", ["colocated", "split"])
def test_yaml_deploys_with_serve_deploy_and_answers(cluster, engine, name, tmp_path):
    address, env, http_port = cluster
    conf = yaml.safe_load((APPS / f"{name}.yaml").read_text())
    conf["http_options"]["port"] = http_port  # a free port instead of 8000; all else as shipped
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(conf))
    deployed = _serve(["deploy", str(path)], address, env)
    assert deployed.returncode == 0, deployed.stderr[-2000:]

    def running() -> bool:
        status = yaml.safe_load(_serve(["status"], address, env).stdout or "{}") or {}
        app = (status.get("applications") or {}).get(name) or {}
        assert app.get("status") != "DEPLOY_FAILED", app.get("message")
        return app.get("status") == "RUNNING"

    _wait(running, 600, f"app {name}")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused",
                           max_retries=0, timeout=300)
    resp = client.chat.completions.create(
        model="peftbd-tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=16)
    _, greedy = engine
    assert resp.choices[0].message.content == greedy(PROMPT, 16)
