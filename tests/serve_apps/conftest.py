"""Fixtures for the Serve tests: the engine's reference outputs, and one local Ray cluster
(`ray start --head --block`, token auth on, loopback only, 2 CPUs as on this box, the proxy
middleware of `serve_apps/proxy_errors.py` on) with `serve_apps/local.yaml` deployed by
`serve deploy` exactly as shipped, except for a free HTTP port.

The cluster is this session's own `ray start --block` process: stopping it stops exactly the Ray
processes it started (and whatever of its process session is left is killed by pid).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import yaml

from jobs.local_cluster import free_port
from tests.schedule_plugin import SERVE_GROUP, at_group_end

APPS = Path(__file__).resolve().parents[2] / "serve_apps"
PROXY_CALLBACK = "serve_apps.proxy_errors:middlewares"
ATTEMPTS = 5  # `ray start` tries: Ray 2.60 waits a fixed 15 s for its dashboard agent


@pytest.fixture(scope="session")
def engine(tiny_cfg):
    """(tokenizer, greedy(user_text, max_tokens) -> text): the engine's output, in-process."""
    from peftbd.data.chat import encode_prompt
    from peftbd.decoding import decode
    from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier

    tok = load_tokenizer(tiny_cfg)
    model = load_verifier(tiny_cfg)
    eos = eos_token_ids(model, tok)
    cache: dict[tuple[str, int], str] = {}

    def greedy(user_text: str, max_tokens: int) -> str:
        key = (user_text, max_tokens)
        if key not in cache:
            ids = encode_prompt(tok, [{"role": "user", "content": user_text}])
            cache[key] = tok.decode(decode(model, ids, None, max_tokens, eos).tokens,
                                    skip_special_tokens=True)
        return cache[key]

    return tok, greedy


@dataclass
class Served:
    """The running cluster: dashboard address, CLI env, app URLs, metrics port, GCS address,
    its temp dir (logs under session_latest/logs), its `ray start` process, the HTTP port."""

    address: str
    env: dict
    metrics_port: int
    gcs: str
    temp: str
    proc: subprocess.Popen  # `ray start --block`: the cluster is up while it runs
    urls: dict[str, str] | None = None
    config: dict | None = None  # the serve config that was deployed
    model: str = ""  # the served model name (the tiny preset's serving.model_name)
    http_port: int = 0

    def client(self, app: str) -> openai.OpenAI:
        """The official openai client of one app (no retries: a failure shows as it is)."""
        return openai.OpenAI(base_url=self.urls[app], api_key="unused", max_retries=0, timeout=600)

    def chat(self, app: str, text: str, method: str, max_tokens: int):
        """One non-streamed chat completion of `text` by `method` (`<model>:<method>`)."""
        return self.client(app).chat.completions.create(
            model=f"{self.model}:{method}", messages=[{"role": "user", "content": text}],
            max_tokens=max_tokens,
        )

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """A Ray / Serve CLI command against this cluster (`serve status`, `ray list ...`)."""
        return subprocess.run([*args, "--address", self.address], env=self.env,
                              capture_output=True, text=True, timeout=300)

    def status(self) -> dict:
        return yaml.safe_load(self.cli("serve", "status").stdout or "{}") or {}

    def deploy(self, config: dict, path: Path) -> None:
        """`serve deploy` `config` (written to `path`), its whole set of apps, and wait until
        exactly those apps run (an app the config lacks is deleted)."""
        path.write_text(yaml.safe_dump(config))
        deployed = self.cli("serve", "deploy", str(path))
        assert deployed.returncode == 0, deployed.stderr[-2000:]

        def running() -> bool:
            apps = self.status().get("applications") or {}
            failed = {k: a.get("message") for k, a in apps.items()
                      if a.get("status") == "DEPLOY_FAILED"}
            assert not failed, failed
            return set(apps) == {a["name"] for a in config["applications"]} and all(
                a.get("status") == "RUNNING" for a in apps.values())

        _wait(running, 900, "the apps", self.proc)

    def url(self, app: dict) -> str:
        """The OpenAI base URL of one app of a deployed config."""
        return f"http://127.0.0.1:{self.http_port}{app['route_prefix']}/v1"

    def replica_pids(self, app: str, deployment: str) -> list[int]:
        out = self.cli("ray", "list", "actors", "--format", "json", "--detail",
                       "--filter", f"class_name=ServeReplica:{app}:{deployment}",
                       "--filter", "state=ALIVE")
        return [a["pid"] for a in json.loads(out.stdout)]


def shipped_config(http_port: int) -> dict:
    """serve_apps/local.yaml as shipped, HTTP on a free port (another cluster may hold 8000)."""
    conf = yaml.safe_load((APPS / "local.yaml").read_text())
    conf["http_options"]["port"] = http_port
    return conf


@pytest.fixture(scope="session")
def served(tmp_path_factory, tiny_cfg) -> Served:
    """Start the cluster, `serve deploy` both apps, wait until they run."""
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": PROXY_CALLBACK,
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "5"}  # a test cluster needs no 30 s drain
    env.pop("RAY_ADDRESS", None)
    for attempt in range(ATTEMPTS):  # on a loaded box the raylet gives up on its agents (15 s)
        proc, temp, cluster = _start_head(env)
        try:
            _wait(lambda: cluster.cli("serve", "status").returncode == 0, 150, "the dashboard", proc)
            break
        except TimeoutError:
            _stop(proc, temp)
            if attempt == ATTEMPTS - 1:
                raise
    try:
        cluster.http_port = free_port()
        cluster.config = shipped_config(cluster.http_port)
        cluster.deploy(cluster.config, tmp_path_factory.mktemp("serve") / "apps.yaml")
        cluster.model = tiny_cfg.serving.model_name
        cluster.urls = {a["name"]: cluster.url(a) for a in cluster.config["applications"]}
        at_group_end(SERVE_GROUP, lambda: _stop(proc, temp))  # not idle through later groups
        yield cluster
    finally:
        _stop(proc, temp)


def _start_head(env: dict) -> tuple[subprocess.Popen, str, Served]:
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must fit
    dashboard, metrics = free_port(), free_port()
    ports = {name: free_port() for name in (
        "port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
        "ray-client-server-port", "runtime-env-agent-port")}
    cmd = ["ray", "start", "--head", "--block", f"--temp-dir={temp}", "--node-ip-address=127.0.0.1",
           "--num-cpus=2", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           "--disable-usage-stats", f"--dashboard-port={dashboard}", f"--metrics-export-port={metrics}",
           *[f"--{k}={v}" for k, v in ports.items()]]
    with open(Path(temp) / "ray_start.log", "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc, temp, Served(f"http://127.0.0.1:{dashboard}", env, metrics,
                              f"127.0.0.1:{ports['port']}", temp, proc)


def _stop(proc: subprocess.Popen, temp: str) -> None:
    """`ray start --block` drains and stops the processes it started on SIGTERM; whatever of its
    process session is left (a failed start can leave some) is killed by pid."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(90)
    ps = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    for pid, sid in (line.split() for line in ps.splitlines()):
        if int(sid) == proc.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    shutil.rmtree(temp, ignore_errors=True)


def _wait(ready, timeout_s: float, what: str, alive: subprocess.Popen) -> None:
    deadline = time.time() + timeout_s
    while not ready():
        if time.time() > deadline or alive.poll() is not None:
            raise TimeoutError(f"{what} not ready after {timeout_s:.0f} s")
        time.sleep(3)
