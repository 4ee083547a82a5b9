"""Where vLLM runs on a cluster: vLLM's environment as the node that runs its engines sees it.

A submitted job's driver runs on the head (`ray job submit`), in an uploaded copy of the code,
and cluster.yaml's head has no vLLM; its workers do (`scripts/install.sh --with-vllm`, recorded
for such copies: `peftbd.peers.vllm_env.venv_dir`). So what runs vLLM asks a task with its own
resources, which lands where it will run, and never resolves vLLM in the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ray

from peftbd.peers.vllm_env import VllmAbsent, vllm_environment, vllm_python


@dataclass(frozen=True)
class NodeVllm:
    """vLLM's Python and engine environment as one node sees them, or why it has none."""

    node: str
    python: str = ""
    env: dict[str, str] = field(default_factory=dict)
    absent: str = ""


def vllm_on_this_node(threads: int) -> NodeVllm:
    """`NodeVllm` of the node this runs on (`vllm_where`'s task)."""
    node = ray.util.get_node_ip_address()
    try:
        return NodeVllm(node, str(vllm_python()), vllm_environment(threads))
    except VllmAbsent as exc:
        return NodeVllm(node, absent=str(exc))


def vllm_where(resources: dict[str, float], threads: int, who: str) -> NodeVllm:
    """vLLM as a node with `resources` free sees it (a task asking for them finds out there);
    VllmAbsent naming that node and the install command where it has none. `who`: what needs
    vLLM, for the message."""
    probe = ray.remote(vllm_on_this_node).options(
        num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0))
    found: NodeVllm = ray.get(probe.remote(threads))
    if found.absent:
        raise VllmAbsent(f"{who}: node {found.node}, where vLLM runs, has no vLLM: {found.absent}")
    return found
