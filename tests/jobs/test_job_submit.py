"""Jobs submitted as users submit them (`ray job submit --working-dir . -- python -m jobs.<job>`:
the Jobs API's `JobSubmissionClient.submit_job` with that runtime env) to the local two-node
cluster shaped as cluster.yaml's: a head that only schedules and has no vLLM, a worker with it."""

from __future__ import annotations

import json
import re
import shlex
import time
from pathlib import Path

import pytest

from peftbd.data.artifact import SPLITS, read_split
from peftbd.peers.vllm_env import absent_reason

from .conftest import GENERATE_LIMIT, GENERATE_OVERRIDES

REPO = Path(__file__).resolve().parents[2]
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}


def test_a_node_without_vllm_names_itself_and_the_install_command(monkeypatch, tmp_path):
    from jobs.vllm_node import vllm_on_this_node
    from peftbd.peers.vllm_env import INSTALL, vllm_python

    monkeypatch.setenv("PEFTBD_VLLM_VENV", str(tmp_path / "none"))
    vllm_python.cache_clear()
    try:
        found = vllm_on_this_node(threads=1)
    finally:
        vllm_python.cache_clear()
    assert found.node and not found.python and INSTALL in found.absent


def test_the_uploaded_working_dir_is_the_code_alone_far_below_rays_limit(tmp_path):
    """What `ray job submit --working-dir .` packs (Ray's own packaging: .git and what
    .gitignore names left out): no outputs, caches or virtual environments, under 5% of Ray's
    limit (512 MiB; the checkout packs ~9 MiB, most of it the shipped tiny world)."""
    import zipfile

    from ray._private.runtime_env import packaging

    package = tmp_path / "pkg.zip"
    packaging.create_package(str(REPO), package, include_parent_dir=False, excludes=[".git"],
                             include_gitignore=True)
    names = zipfile.ZipFile(package).namelist()
    assert not [n for n in names if n.split("/")[0] in ("outputs", ".venv", ".venv-vllm")
                or "__pycache__" in n or ".egg-info" in n]
    assert "peftbd/decoding/loop.py" in names
    assert package.stat().st_size < 0.05 * packaging.GCS_STORAGE_MAX_SIZE


def _finish(client, job: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while (status := str(client.get_job_status(job).value)) not in TERMINAL:
        if time.monotonic() > deadline:
            client.stop_job(job)
            raise TimeoutError(f"job {job} still {status} after {timeout_s:.0f} s:\n"
                               f"{client.get_job_logs(job)[-3000:]}")
        time.sleep(2)
    return status


@pytest.fixture(scope="module")
def cluster(tiny_world):
    """The two-node local cluster with cluster.yaml's head: no CPU slots, no vLLM."""
    from jobs.local_cluster import local_cluster

    with local_cluster(dashboard=True, head_cpus=0, head_vllm=False) as running:
        yield running


def _submit(cluster, out: Path, *sets: str, limit: int = GENERATE_LIMIT) -> tuple[object, str]:
    """`ray job submit --working-dir . -- python -m jobs.generate ...`: (client, job id)."""
    return _job(cluster, "jobs.generate", "--out", str(out), "--limit", str(limit),
                *(a for s in sets for a in ("--set", s)))


def _job(cluster, module: str, *args: str) -> tuple[object, str]:
    """`ray job submit --working-dir . -- python -m <module> <args>`: (client, job id)."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(cluster.dashboard_url)
    entrypoint = shlex.join(["python", "-m", module, *args])
    return client, client.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": str(REPO)})


@pytest.mark.integration
@pytest.mark.slow  # two nodes, a job's driver and a vLLM engine actor (~1 min)
@pytest.mark.skipif(absent_reason() is not None, reason=str(absent_reason()))
def test_generate_with_vllm_submitted_from_a_head_without_it_runs_its_engines_on_the_worker(
        cluster, tmp_path):
    out = tmp_path / "continuations"
    client, job = _submit(cluster, out, *GENERATE_OVERRIDES, "generate.backend=vllm",
                          "generate.num_actors=1")
    status = _finish(client, job, 600)
    logs = client.get_job_logs(job)
    assert status == "SUCCEEDED", logs[-4000:]
    assert "generate continuations: 32/32" in logs  # the job's own lines reach `ray job logs`
    rows = {s: read_split(out, s).num_rows for s in SPLITS}
    assert rows == {"train": 24, "val": 4, "test": 4}, rows


@pytest.mark.integration
@pytest.mark.slow  # two submissions of a generate run (~1 min)
def test_a_job_stopped_mid_stage_resumes_when_submitted_again(cluster, tmp_path):
    out = tmp_path / "continuations"
    sets = [*GENERATE_OVERRIDES, "data.max_new_tokens=128", "generate.batch_size=1",
            "generate.num_actors=1"]
    client, job = _submit(cluster, out, *sets)
    work = out.with_name(out.name + ".work")
    deadline = time.monotonic() + 300
    while len(list(work.glob("part-*.parquet"))) < 2:
        assert time.monotonic() < deadline and str(client.get_job_status(job).value) not in TERMINAL, \
            client.get_job_logs(job)[-3000:]
        time.sleep(0.2)
    client.stop_job(job)  # `ray job stop`
    assert _finish(client, job, 120) == "STOPPED"
    assert not (out / "manifest.json").exists()
    kept = len(list(work.glob("part-*.parquet")))
    again, job = _submit(cluster, out, *sets)
    assert _finish(again, job, 600) == "SUCCEEDED", again.get_job_logs(job)[-4000:]
    said = re.search(r"resuming: (\d+) of 32 rows already done", again.get_job_logs(job))
    manifest = json.loads((out / "manifest.json").read_text())
    assert said and int(said[1]) == manifest["counts"]["resumed_rows"] >= kept >= 2
    assert {s: read_split(out, s).num_rows for s in SPLITS} == {"train": 24, "val": 4, "test": 4}


@pytest.mark.integration
@pytest.mark.slow  # our engine and vLLM's, eager, on the tiny world (~1 min)
@pytest.mark.skipif(absent_reason() is not None, reason=str(absent_reason()))
def test_the_peer_job_submitted_from_a_head_without_vllm_writes_its_table(cluster, tmp_path):
    from peftbd.benchmarking.peer_schema import PeerTable

    out = tmp_path / "peer"
    client, job = _job(cluster, "jobs.peer", "--out", str(out), "--no-shape", "--prompts", "3",
                       "--max-new-tokens", "12", "--batch-size", "2", "--paths", "eager",
                       "--artifacts", str(tmp_path / "no-main-job"))
    status = _finish(client, job, 600)
    logs = client.get_job_logs(job)
    assert status == "SUCCEEDED", logs[-4000:]
    table = PeerTable.model_validate(json.loads((out / "peer.json").read_text()))
    (row,) = table.rows
    assert (row.path, row.ours_compiled, row.vllm_compiled) == ("eager", False, False)
    assert set(row.arms) == {"ours_ar_b1", "vllm_ar_b1", "ours_ar_b2", "vllm_ar_b2",
                             "ours_prompt_lookup", "vllm_ngram"}
    assert row.identical == 3 and row.ngram_identical == 3
    assert "| greedy AR, batch 2 |" in (out / "peer.md").read_text()
    assert "| prompt lookup / ngram, batch 1 |" in logs
    # no main job under --artifacts: no DFlash pair, and the table says why
    assert table.dflash is None and "no finished DFlash training in" in str(table.dflash_absent)
    assert "**DFlash in both engines**: not run (no finished DFlash training in" in logs
