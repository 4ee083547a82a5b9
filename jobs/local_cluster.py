"""A two-node Ray cluster on this machine, shaped like cluster.yaml's GPU node types: a head
with the `verifier` resource and a worker with the `drafter` resource (1 each, no GPUs), so the
cross-node placements of `jobs.placement` run here, not only on a cloud.

    python -m jobs.local_cluster        # prints its RAY_ADDRESS; Ctrl-C stops both nodes

Each node is its own `ray start --block` process (what cluster.yaml runs per node) in its own
process session, temp dir and ports: stopping it stops the Ray processes it started, and what is
left of its session is killed by pid. A node also stops when the process that started it dies.
Ray 2.60 has no loopback-only node: it advertises this machine's IP and its gRPC servers listen
on every interface (the dashboard binds 127.0.0.1), so on a shared network set RAY_AUTH_MODE=token.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from peftbd.peers.vllm_env import venv_dir

log = logging.getLogger(__name__)
NODE_RESOURCES = {"head": {"verifier": 1}, "worker": {"drafter": 1}}
"""Custom resources per node: cluster.yaml's `gpu_verifier` and `gpu_drafter` node types."""
STARTED = "Ray runtime started."  # `ray start` prints it once the node is registered
RAY_CLI = (sys.executable, "-m", "ray.scripts.scripts")
"""`ray`, from this interpreter's own environment (no activated venv, no `ray` on PATH needed)."""
_LIBC = ctypes.CDLL(None) if sys.platform == "linux" else None
NO_VLLM = "/nonexistent/peftbd-head-has-no-vllm"
"""The head's `PEFTBD_VLLM_VENV` where it is to have no vLLM (`local_cluster(head_vllm=False)`)."""


class NodeError(RuntimeError):
    """A node did not start, or stopped; the message names its logs."""


@dataclass
class _Node:
    name: str
    proc: subprocess.Popen[bytes]
    temp: Path

    def describe(self) -> str:
        return (f"the {self.name} node (Ray's logs: {self.temp}/session_latest/logs; `ray "
                f"start`'s output: {self.temp / 'ray_start.log'})")


@dataclass(frozen=True)
class LocalCluster:
    """The running cluster: its `address` (`ray.init(address)`, RAY_ADDRESS), the dashboard's
    URL (None without one) and each node's temp dir (Ray's logs: `<dir>/session_latest/logs`)."""

    address: str
    dashboard_url: str | None
    temp_dirs: dict[str, Path]
    _nodes: list[_Node] = field(repr=False)

    def check_alive(self) -> None:
        """Raise `NodeError` if a node has stopped (`ray start --block` exits when a Ray
        process of its node dies)."""
        for node in self._nodes:
            if node.proc.poll() is not None:
                raise NodeError(f"{node.describe()} stopped with status {node.proc.returncode}")


@contextlib.contextmanager
def local_cluster(num_cpus: int = 3, dashboard: bool = True, timeout_s: float = 180,
                  attempts: int = 3, head_cpus: int | None = None,
                  head_vllm: bool = True) -> Iterator[LocalCluster]:
    """Start the head, then the worker, each with `num_cpus` logical CPUs (3 fit two one-CPU
    replicas and the Ingress on one node, as split-same-node and split-fractional-gpu ask; the
    head `head_cpus` if given: 0 as cluster.yaml's, which only schedules); with `head_vllm`
    false the head's processes find no vLLM (as cluster.yaml's head, which never installs it:
    its `PEFTBD_VLLM_VENV` names a directory that does not exist). Yield it with RAY_ADDRESS
    pointing at it (so `jobs.ray_env.init_ray` joins it); stop the worker, then the head. A node
    not up within `timeout_s` is stopped and the start retried (`attempts` in all: on a busy
    machine a raylet can give up on its agents). The logs of a failed start, and of a cluster
    whose body raised, are kept (and named); otherwise removed."""
    env = _node_env()
    head_env = env if head_vllm else {**env, "PEFTBD_VLLM_VENV": NO_VLLM}
    cpus = {"head": num_cpus if head_cpus is None else head_cpus, "worker": num_cpus}
    for attempt in range(1, attempts + 1):
        nodes: list[_Node] = []
        try:
            head_port, dashboard_port = free_port(), free_port() if dashboard else None
            nodes.append(_start("head", head_env, cpus["head"], _head_args(head_port, dashboard_port)))
            _wait_started(nodes[-1], timeout_s)
            nodes.append(_start("worker", env, cpus["worker"], [f"--address=127.0.0.1:{head_port}"]))
            _wait_started(nodes[-1], timeout_s)
            break
        except BaseException as exc:
            _stop(nodes, keep_logs=isinstance(exc, Exception))
            if not isinstance(exc, NodeError) or attempt == attempts:
                raise
            log.warning("local cluster, start %d of %d failed: %s", attempt, attempts, exc)
    failed = False
    try:
        with mock.patch.dict(os.environ, {"RAY_ADDRESS": f"127.0.0.1:{head_port}"}):
            yield LocalCluster(os.environ["RAY_ADDRESS"],
                               f"http://127.0.0.1:{dashboard_port}" if dashboard_port else None,
                               {n.name: n.temp for n in nodes}, nodes)
    except Exception:
        failed = True
        log.warning("local cluster: Ray's logs kept in %s", ", ".join(str(n.temp) for n in nodes))
        raise
    finally:
        _stop(nodes, keep_logs=failed)


def _node_env() -> dict[str, str]:
    """The nodes' environment: this one without RAY_ADDRESS, no drain on stop, vLLM where this
    checkout finds it (a job's uploaded working dir has no `.venv-vllm`, and this machine's
    install record may name another checkout's), and the auth mode
    that a driver in this process connects with: RAY_AUTH_MODE (which Ray reads at import),
    unset meaning disabled; with token, Ray's token (`ray get-auth-token --generate` if none)."""
    env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
           "PEFTBD_VLLM_VENV": str(venv_dir())}
    env.pop("RAY_ADDRESS", None)
    env.setdefault("RAY_AUTH_MODE", "disabled")
    if env["RAY_AUTH_MODE"] == "token":
        subprocess.run([*RAY_CLI, "get-auth-token", "--generate"], env=env, check=True,
                       capture_output=True)
    return env


def _head_args(port: int, dashboard_port: int | None) -> list[str]:
    args = ["--head", f"--port={port}", f"--ray-client-server-port={free_port()}",
            f"--include-dashboard={str(bool(dashboard_port)).lower()}", "--disable-usage-stats"]
    if dashboard_port:
        args += ["--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}"]
    return args


def _start(name: str, env: dict[str, str], num_cpus: int, args: list[str]) -> _Node:
    temp = Path(tempfile.mkdtemp(prefix="rlc", dir="/tmp"))  # short: Ray's socket paths must fit
    ports = [f"--{k}={free_port()}" for k in (  # two nodes on one machine: none of the defaults
        "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")]
    cmd = [*RAY_CLI, "start", "--block", *args, f"--temp-dir={temp}", f"--num-cpus={num_cpus}",
           "--num-gpus=0", f"--resources={json.dumps(NODE_RESOURCES[name])}",
           f"--object-store-memory={1 << 30}", *ports]
    with open(temp / "ray_start.log", "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_die_with_parent)
    return _Node(name, proc, temp)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the thread that started it exits (Linux)."""
    if _LIBC is not None:
        _LIBC.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _wait_started(node: _Node, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while STARTED not in (node.temp / "ray_start.log").read_text(errors="replace"):
        if node.proc.poll() is not None:
            last = (node.temp / "ray_start.log").read_text(errors="replace").strip()
            raise NodeError(f"{node.describe()} exited with status {node.proc.returncode}: "
                            f"{last.splitlines()[-1] if last else 'no output'}")
        if time.monotonic() > deadline:
            raise NodeError(f"{node.describe()} did not start within {timeout_s:.0f} s")
        time.sleep(0.5)


def _stop(nodes: list[_Node], keep_logs: bool) -> None:
    """Stop the nodes, last started first: SIGTERM to `ray start --block` (it stops the Ray
    processes it started), then SIGKILL by pid to whatever is left of its process session."""
    for node in reversed(nodes):
        if node.proc.poll() is None:
            node.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.proc.wait(60)
        ps = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
        for pid, sid in (line.split() for line in ps.splitlines()):
            if int(sid) == node.proc.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        if not keep_logs:
            shutil.rmtree(node.temp, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


EPILOG = """\
Then, in another shell, jobs join it through RAY_ADDRESS, e.g. the placements that need
this cluster's `drafter` / `verifier` resources (skipped on a cluster without them):

  export RAY_ADDRESS=<the address printed>
  python -m jobs.placement --placements split-cross-node,split-same-node,split-fractional-gpu

`python -m jobs.placement --local-cluster` starts and stops such a cluster by itself.
Logical CPUs are scheduling slots, not cores: both nodes share this machine's cores.
Ray's gRPC ports listen on every interface (the dashboard on 127.0.0.1 only): on a shared
network run both shells with RAY_AUTH_MODE=token (the nodes take RAY_AUTH_MODE from this shell;
unset: no auth)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.local_cluster", epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start a two-node Ray cluster on this machine (a head with the `verifier` "
                    "resource, a worker with `drafter`, as cluster.yaml's GPU node types), print "
                    "its address and wait; Ctrl-C stops both nodes.")
    parser.add_argument("--num-cpus", type=int, default=3,
                        help="logical CPUs per node (default 3: two one-CPU replicas and the Ingress)")
    parser.add_argument("--no-dashboard", action="store_true", help="start no Ray dashboard")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where started ignoring it
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stops the nodes, as Ctrl-C does
    try:
        with local_cluster(args.num_cpus, not args.no_dashboard) as cluster:
            print(f"local Ray cluster: head {NODE_RESOURCES['head']} + worker "
                  f"{NODE_RESOURCES['worker']}, {args.num_cpus} CPUs each, auth "
                  f"{os.environ.get('RAY_AUTH_MODE', 'disabled')}\n"
                  f"  export RAY_ADDRESS={cluster.address}\n"
                  f"  dashboard: {cluster.dashboard_url or 'none'}\n"
                  f"  logs: {', '.join(f'{d}/session_latest/logs' for d in cluster.temp_dirs.values())}\n"
                  "Ctrl-C stops both nodes.", flush=True)
            while True:
                cluster.check_alive()
                time.sleep(1)
    except NodeError as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
