"""Jobs submitted as users submit them (`ray job submit --working-dir . -- python -m jobs.<job>`:
the Jobs API's `JobSubmissionClient.submit_job` with that runtime env) to the local two-node
cluster shaped as cluster.yaml's: a head that only schedules and has no vLLM, a worker with it.
Generate with each backend, a stop and resubmit, one training, the benchmark, placement and the
peer; then `serve deploy` of both shipped apps on the same cluster (the main job's submission:
tests/jobs/test_pipeline_e2e.py)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from pathlib import Path

import matplotlib.image as mpimg
import openai
import pytest
import yaml

from jobs.local_cluster import free_port
from peftbd.analysis.placement import Devices
from peftbd.analysis.placement_verdict import PlacementReport
from peftbd.analysis.report import FIGURE_1, FIGURE_3, FIGURE_5, REPORT
from peftbd.benchmarking.arms import arm_specs
from peftbd.benchmarking.schema import Results
from peftbd.data.artifact import SPLITS, read_split
from peftbd.manifest import read_manifest
from peftbd.methods import serving_names
from peftbd.peers.vllm_env import absent_reason
from tests.prometheus import COUNTED_ON_EVENTS, dashboard_metrics, scraped_once_exported

from .conftest import BENCHMARK_SETS, GENERATE_LIMIT, GENERATE_OVERRIDES, N_PROMPTS

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


def _succeeded(cluster, module: str, *args: str, timeout_s: float = 600) -> str:
    """Submit `python -m <module> <args>`, wait, and return the job's logs (`ray job logs`),
    failing with their tail unless it SUCCEEDED."""
    client, job = _job(cluster, module, *args)
    status = _finish(client, job, timeout_s)
    logs = client.get_job_logs(job)
    assert status == "SUCCEEDED", logs[-4000:]
    return logs


def _sets(items) -> list[str]:
    return [a for item in items for a in ("--set", item)]


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


@pytest.mark.integration
@pytest.mark.slow  # the module's cluster (~20 s to start)
def test_a_failing_job_ends_failed_with_one_error_line_in_its_logs(cluster, tmp_path):
    """`ray job status` says FAILED and `ray job logs` ends with the job's one-line error: the
    problem and its fix, no traceback."""
    client, job = _job(cluster, "jobs.train", "--method", "fastmtp", "--data",
                       str(tmp_path / "nowhere"), "--out", str(tmp_path / "out"))
    assert _finish(client, job, 300) == "FAILED"
    logs = client.get_job_logs(job).split("Running entrypoint for job", 1)[1]
    errors = [line for line in logs.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(tmp_path / "nowhere") in errors[0], logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]


@pytest.fixture(scope="module")
def continuations(cluster, tmp_path_factory) -> Path:
    """A generate run with the engine backend, submitted: 24 / 4 / 4 rows."""
    out = tmp_path_factory.mktemp("submitted") / "continuations"
    logs = _succeeded(cluster, "jobs.generate", "--out", str(out), "--limit", str(GENERATE_LIMIT),
                      *_sets([*GENERATE_OVERRIDES, "generate.backend=engine", "generate.num_actors=1"]))
    assert "generate continuations: 32/32" in logs
    return out


@pytest.mark.integration
@pytest.mark.slow  # a generate run and one short training, both submitted (~1 min)
def test_generate_with_the_engine_then_a_training_submitted_write_their_artifacts(
        cluster, continuations, tmp_path):
    assert {s: read_split(continuations, s).num_rows for s in SPLITS} == {
        "train": 24, "val": 4, "test": 4}
    out = tmp_path / "fastmtp"
    optim = ["global_batch_size=8", "max_steps=3", "eval_every=3", "checkpoint_every=3",
             "eval_batches=1"]
    logs = _succeeded(cluster, "jobs.train", "--method", "fastmtp", "--data", str(continuations),
                      "--out", str(out), *_sets([*GENERATE_OVERRIDES, "training.num_workers=1",
                                                 *(f"fastmtp.optim.{o}" for o in optim)]))
    manifest = read_manifest(out)
    assert manifest["stage"] == "train_fastmtp" and (out / "mtp_head" / "mtp_head.json").is_file()
    assert f"train_fastmtp: {out} (" in logs and "eval loss" in logs  # the job's own summary line
    assert manifest["metrics"]["eval_loss"] > 0


@pytest.mark.integration
@pytest.mark.slow  # the benchmark's every arm on 3 prompts, two timing workers, vLLM's reference
def test_the_benchmark_submitted_writes_results_report_and_manifest_and_runs_vllm_on_the_worker(
        cluster, small_cfg, artifacts, tmp_path):
    out = tmp_path / "benchmark"
    logs = _succeeded(cluster, "jobs.benchmark", "--preset", "tiny-full", "--artifacts",
                      str(artifacts), "--out", str(out), "--repeats", "1", *_sets(BENCHMARK_SETS))
    written = json.loads((out / "results.json").read_text())
    results = Results.from_dict(written)  # the file reads back as what was written
    assert json.loads(results.to_json()) == written
    arms = [s.id for s in arm_specs(small_cfg)]
    assert list(results.arms) == arms
    # the tiny preset's two timing workers: each times its share, results.json merges them
    assert results.prompts.count == N_PROMPTS and results.timing.workers == 2
    assert all(len(arm.repeats) == 1 for arm in results.arms.values())
    assert all(arm.audit is not None and arm.audit.exact_pct == 100.0
               for arm in results.arms.values() if arm.speculative)
    assert results.drafters["peftbd"].untrained is True
    vocab = results.drafters["peftbd_head"].draft_vocab
    assert vocab is not None
    assert vocab["size"] == small_cfg.peftbd_head.draft_vocab and 0 < vocab["train_token_coverage"] <= 1
    report = (out / REPORT).read_text()
    assert "Table 3" in report and "| generate continuations | 11.5 | 512 |" in report
    assert mpimg.imread(out / FIGURE_1).shape[0] > 200
    sizes = list(small_cfg.decoding.batch_sizes)
    rows = results.concurrency
    assert [(r.arm, r.batch_size) for r in rows] == [(a, b) for a in arms for b in sizes]
    assert all(r.exact for r in rows) and results.timing.batch_sizes == sizes
    assert "Table 8" in report and "Engine goal: AR at batch 16" in report
    assert mpimg.imread(out / FIGURE_3).shape[0] > 200
    sampling = results.sampling  # both workers' sampled passes, merged
    assert sampling is not None
    assert sampling.temperatures == [0.0, 1.0] and sampling.prompts == N_PROMPTS
    assert all(e.check is not None and e.check.valid == N_PROMPTS
               for arm in sampling.arms.values() for e in arm.by_temperature if e.temperature > 0)
    assert "Table 11" in report and mpimg.imread(out / FIGURE_5).shape[0] > 200
    manifest = read_manifest(out)
    assert manifest["stage"] == "benchmark" and manifest["wall_seconds"] > 0
    assert manifest["workers"]["workers"] == 2 and manifest["workers"]["peak_rss_mib"] > 0
    assert manifest["workers"]["dtype"] == "float32"
    assert len(manifest["summary"]) == len(arms) + 1  # each arm, then AR vs independent engines
    assert manifest["summary"][-1].startswith("AR vs independent engines: HF generate: ")
    assert manifest["summary"][-1] in logs  # the job's summary reaches `ray job logs`
    # one shard checks AR against HF generate and vLLM, run on the node of its Ray worker (the
    # worker: the head has no vLLM); without vLLM said absent with the node and install command
    refs = {r.engine: r for r in results.references}
    assert refs["hf_generate"].identical == refs["hf_generate"].checked > 0
    vllm = refs["vllm"]
    assert (vllm.identical == vllm.checked > 0 if absent_reason() is None
            else "install.sh --with-vllm" in str(vllm.absent)), vllm


@pytest.mark.integration
@pytest.mark.slow  # Serve on the cluster: colocated and split, two methods' levels (~1 min)
def test_the_placement_job_submitted_measures_colocated_and_split(cluster, tmp_path):
    out = tmp_path / "placement"
    logs = _succeeded(cluster, "jobs.placement", "--out", str(out), *_sets([
        "decoding.num_prompts=1", "decoding.max_new_tokens=6", "decoding.repeats=1",
        "serving.client_concurrency=[1, 2]", "serving.level_requests=2",
        "serving.synthetic=[peftbd=3]", "serving.placements=[colocated, split]",
        "serving.placement_methods=[ar, peftbd, fastmtp, peftbd_head]"]))
    result = PlacementReport.read(out / "placement.json")
    assert set(result.summary) == {"colocated", "split"} and result.skipped == {}
    synthetic = "peftbd [synthetic: 3/round]"
    for methods in result.summary.values():
        assert set(methods) == {"ar", synthetic, "fastmtp", "peftbd_head"}
        assert all(m.requests == 2 and m.transport_ms_per_round is not None  # 1 prompt, twice
                   for m in methods.values())
    # a split drafter is shipped what it reads (KV, hidden states, features); colocated: nothing
    split, colocated = result.summary["split"], result.summary["colocated"]
    assert all((split[m].feature_bytes_per_token or 0) > 0
               for m in (synthetic, "fastmtp", "peftbd_head"))
    assert all(m.feature_bytes_per_token == 0 for m in colocated.values())
    assert result.devices == {"colocated": Devices(total=2, verifiers=2),
                              "split": Devices(total=2, verifiers=1)}
    for row in result.concurrency:  # every replica's load was read
        assert set(row.busy) == ({"engine"} if row.placement == "colocated"
                                 else {"drafter", "verifier"})
        assert all(f is not None and 0 <= f <= 1.05 for f in row.busy.values()), row  # AR: an idle drafter
        assert (row.busy.get("engine", row.busy.get("verifier")) or 0) > 0, row
    assert {(v.method, v.placement) for v in result.verdicts} == {
        (synthetic, "split"), ("fastmtp", "split"), ("peftbd_head", "split")}
    assert all(r.spec.synthetic == 3.0 for r in result.requests if r.method == synthetic)
    assert result.outputs_identical is True
    md = (out / "placement.md").read_text()
    assert md.startswith("# Placement") and "## Verdict" in md and "largest split-only cost" in md
    assert all(None not in v.ledgers for v in result.verdicts) and "split lost most to" in md
    assert (out / "manifest.json").is_file() and "## Verdict" in logs  # the report, in the logs


def _serve(cluster, *args: str) -> subprocess.CompletedProcess:
    """`serve <args> --address <dashboard>` against the cluster."""
    return subprocess.run(["serve", *args, "--address", cluster.dashboard_url], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.integration
@pytest.mark.slow  # both shipped apps deployed on the two nodes (~1.5 min)
def test_serve_deploy_on_the_cluster_streams_from_both_apps_and_prometheus_scrapes_the_dashboards_metrics(
        cluster, tmp_path):
    """serve_apps/local.yaml as shipped but for two lines a two-node cluster on one machine needs
    (a real cluster has one node per machine): a free HTTP port, and the proxy on the head only
    (two proxies on one machine cannot both bind it)."""
    conf = yaml.safe_load((REPO / "serve_apps" / "local.yaml").read_text())
    conf["http_options"]["port"], conf["proxy_location"] = free_port(), "HeadOnly"
    (path := tmp_path / "apps.yaml").write_text(yaml.safe_dump(conf))
    deployed = _serve(cluster, "deploy", str(path))
    assert deployed.returncode == 0, deployed.stderr[-2000:]
    try:
        deadline = time.monotonic() + 900
        while True:
            apps = (yaml.safe_load(_serve(cluster, "status").stdout or "{}") or {}).get("applications") or {}
            assert not [a for a in apps.values() if a.get("status") == "DEPLOY_FAILED"], apps
            if {"colocated", "split"} <= set(apps) and all(a["status"] == "RUNNING" for a in apps.values()):
                break
            assert time.monotonic() < deadline, apps
            time.sleep(3)
        base = f"http://127.0.0.1:{conf['http_options']['port']}"
        for app in ("colocated", "split"):
            client = openai.OpenAI(base_url=f"{base}/{app}/v1", api_key="unused", max_retries=0,
                                   timeout=300)
            messages = [{"role": "user", "content": "Name a list method."}]
            for name in serving_names():  # every method once: every dashboard series is fed
                client.chat.completions.create(model=f"peftbd-tiny:{name}", messages=messages,
                                               max_tokens=8)
            whole = client.chat.completions.create(model="peftbd-tiny:peftbd", messages=messages,
                                                   max_tokens=16).choices[0].message.content
            chunks = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="peftbd-tiny:peftbd", messages=messages, max_tokens=16, stream=True)
                if c.choices]
            assert len([c for c in chunks if c]) > 1 and "".join(chunks) == whole, (app, chunks)
        # what Prometheus scrapes (every node's endpoint, from the head's discovery file): the
        # replicas run on the worker, so their series come from the worker's endpoint
        names = dashboard_metrics()
        text = scraped_once_exported(cluster.temp_dirs["head"], names - COUNTED_ON_EVENTS)
        assert re.search(r'ray_peftbd_draft_ms_bucket\{[^}]*placement="split"', text)
    finally:
        _serve(cluster, "shutdown", "-y")
