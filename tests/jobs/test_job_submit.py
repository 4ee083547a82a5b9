"""Jobs submitted as users submit them (`ray job submit --working-dir . -- python -m jobs.<job>`:
the Jobs API's `JobSubmissionClient.submit_job` with that runtime env) to the local two-node
cluster shaped as cluster.yaml's: a head that only schedules and has no vLLM, a worker with it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from peftbd.data.artifact import SPLITS, read_split
from peftbd.peers.vllm_env import absent_reason

from .conftest import GENERATE_LIMIT, GENERATE_OVERRIDES

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def test_a_node_without_vllm_names_itself_and_the_install_command(monkeypatch, tmp_path):
    from jobs.generate_vllm import vllm_on_this_node
    from peftbd.peers.vllm_env import INSTALL, vllm_python

    monkeypatch.setenv("PEFTBD_VLLM_VENV", str(tmp_path / "none"))
    vllm_python.cache_clear()
    try:
        found = vllm_on_this_node(threads=1)
    finally:
        vllm_python.cache_clear()
    assert found.node and not found.python and INSTALL in found.absent


def _finish(client, job: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (status := str(client.get_job_status(job).value)) not in TERMINAL:
        if time.monotonic() > deadline:
            client.stop_job(job)
            raise TimeoutError(f"job {job} still {status} after {timeout_s:.0f} s:\n"
                               f"{client.get_job_logs(job)[-3000:]}")
        time.sleep(2)
    return status


@pytest.mark.integration
@pytest.mark.slow  # two nodes, a job's driver and a vLLM engine actor (~1.5 min)
@pytest.mark.skipif(absent_reason() is not None, reason=str(absent_reason()))
def test_generate_with_vllm_submitted_from_a_head_without_it_runs_its_engines_on_the_worker(
        tmp_path, tiny_world):
    from ray.job_submission import JobSubmissionClient

    from jobs.local_cluster import local_cluster

    out = tmp_path / "continuations"
    sets = [*GENERATE_OVERRIDES, "generate.backend=vllm", "generate.num_actors=1"]
    entrypoint = " ".join(["python -m jobs.generate", f"--out {out}", f"--limit {GENERATE_LIMIT}",
                           *(f"--set '{s}'" for s in sets)])
    with local_cluster(dashboard=True, head_cpus=0, head_vllm=False) as cluster:
        client = JobSubmissionClient(cluster.dashboard_url)
        job = client.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": str(REPO)})
        status = _finish(client, job, 600)
        logs = client.get_job_logs(job)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "[generate" in logs or "generate" in logs  # the job's own lines reach `ray job logs`
    rows = {s: read_split(out, s).num_rows for s in SPLITS}
    assert rows == {"train": 24, "val": 4, "test": 4}, rows
