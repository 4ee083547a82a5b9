"""The two-node local cluster (jobs.local_cluster) and the cross-node placement on it."""

from __future__ import annotations

import pytest

from peftbd.analysis.placement import Devices
from peftbd.analysis.placement_verdict import PlacementReport
from peftbd.config import load_config


@pytest.mark.integration
@pytest.mark.slow
def test_cross_node_placement_runs_on_a_local_two_node_cluster(tmp_path, tiny_world, monkeypatch):
    import ray
    from ray.util.state import list_actors

    from jobs.local_cluster import local_cluster
    from jobs.placement import run_placement
    from jobs.ray_env import init_ray

    cfg = load_config("tiny", overrides=[
        "decoding.num_prompts=2", "decoding.max_new_tokens=6", "decoding.repeats=1",
        "serving.client_concurrency=[1]", "serving.placement_methods=[ar, peftbd]",
        "serving.placements=[split-cross-node]"])
    # no `ray` on PATH, as for `<venv>/bin/python -m jobs.placement --local-cluster` with no venv
    # activated: the nodes start from this interpreter's own Ray
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with local_cluster(dashboard=True) as cluster:  # the state API below needs the dashboard
        try:
            init_ray()  # joins the cluster through its RAY_ADDRESS
            nodes = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
            custom = sorted(({k: r[k] for k in ("drafter", "verifier") if k in r}
                             for r in nodes.values()), key=str)
            assert custom == [{"drafter": 1}, {"verifier": 1}], nodes  # as cluster.yaml's
            out = run_placement(cfg, tmp_path / "placement")
            replicas = {a.class_name.split(":")[-1]: a.node_id  # gone now, still listed
                        for a in list_actors(cluster.dashboard_url, detail=True, limit=1000)
                        if a.class_name.startswith("ServeReplica:placement:")}
            cluster.check_alive()
        finally:
            ray.shutdown()
    result = PlacementReport.read(out / "placement.json")
    assert set(result.summary) == {"split-cross-node"} and result.skipped == {}
    assert set(result.summary["split-cross-node"]) == {"ar", "peftbd"}
    assert result.devices == {"split-cross-node": Devices(total=2, verifiers=1)}
    assert len(result.requests) == 4 and result.outputs_identical is True  # AR's text
    assert nodes[replicas["Drafter"]].get("drafter") == 1, replicas  # cross-node: the worker
    assert nodes[replicas["Verifier"]].get("verifier") == 1, replicas  # the head
