"""The main job end to end on the tiny preset (sizes trimmed with --set to keep CI short), with a
plugin method beside the built-in ones: `tests/plugins/toy_bigram_drafter.py`, outside the
project's packages, named only by `--set methods.plugins=[...]` and importable through PYTHONPATH
(the job's Ray workers inherit it): it is trained, benchmarked, audited and reported with no
edit to the project. Its first run is submitted as users submit it to a cluster (`ray job
submit`, on the local two-node one); the reruns that follow run it here."""

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "plugins"
TRIM = [
    "methods.plugins=[toy_bigram_drafter]",
    # one worker per training: spreading it over two is tests/jobs/test_train.py's subject
    "training.num_workers=1",
    "data.train_size=64", "data.val_size=8", "data.test_size=8", "data.max_new_tokens=32",
    *(f"{section}.optim.{key}" for section in ("peftbd", "fastmtp", "peftbd_head", "dflash")
      for key in ("max_steps=8", "eval_every=4", "checkpoint_every=4")),
    # DFlash's recipe differs from the head's in its anchors alone, so the ablation trains one
    # variant, not four (a training each; the table over several: test_learning_curves.py)
    "dflash.feature_rule=three", "dflash.block_masks=block", "dflash.loss_decay=0.0",
    "dflash.anchor_fusion=true", "dflash.anchored=false",
    "decoding.num_prompts=4", "decoding.repeats=1", "decoding.max_new_tokens=16",
    "decoding.batch_sizes=[1, 4]", "decoding.temperatures=[0, 1]", "decoding.sampling_prompts=2",
    "decoding.reference_engines=[hf_generate]",  # vLLM's: tests/jobs/test_benchmark.py
    # the cost profile of the tiny verifier itself (the 0.6B one takes minutes)
    "cost_profile.architecture=model", "cost_profile.early_exit_layers=1",
    "cost_profile.dtypes=[float32]", "cost_profile.repeats=1", "cost_profile.kv_len=64",
]
STAGES = ("continuations", "peftbd", "fastmtp", "peftbd_head", "dflash", "toy_bigram",
          "cost_profile", "benchmark")
NAMES = ("world", "generate", "train_peftbd", "train_fastmtp", "train_peftbd_head", "train_dflash",
         "train_toy_bigram", "cost_profile", "benchmark")
"""The default main job's stages (the ablations' own trainings run only with --preset tiny-full)."""


def _pipeline(out: Path, *extra: str, job: str = "jobs.pipeline") -> str:
    args = [sys.executable, "-m", job, "--out", str(out)]
    for item in TRIM:
        args += ["--set", item]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(PLUGINS), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([*args, *extra], cwd=REPO, capture_output=True, text=True, timeout=1500,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def _submitted(out: Path) -> str:
    """The same main job as users run it on a cluster: `ray job submit --working-dir . -- python
    -m jobs.pipeline ...` (the Jobs API's `submit_job` with that runtime env) to the local
    two-node cluster with cluster.yaml's head (no CPU slots: every stage's work runs on the
    worker); the job's own output, as `ray job logs` shows it after the job manager's lines."""
    from ray.job_submission import JobSubmissionClient

    from jobs.local_cluster import local_cluster

    entrypoint = shlex.join(["python", "-m", "jobs.pipeline", "--out", str(out),
                             *(a for item in TRIM for a in ("--set", item))])
    with local_cluster(dashboard=True, head_cpus=0) as cluster:
        client = JobSubmissionClient(cluster.dashboard_url)
        job = client.submit_job(entrypoint=entrypoint, runtime_env={
            "working_dir": str(REPO), "env_vars": {"PYTHONPATH": str(PLUGINS)}})
        deadline = time.monotonic() + 1500
        while (status := str(client.get_job_status(job).value)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
            assert time.monotonic() < deadline, client.get_job_logs(job)[-3000:]
            time.sleep(3)
        logs = client.get_job_logs(job)
    assert status == "SUCCEEDED", logs[-5000:]
    return logs.split("Running entrypoint for job", 1)[1].split("\n", 1)[1]


def _plan(stdout: str) -> dict[str, str]:
    """{stage: RUN | skip} from the plan the job prints before it starts."""
    plan = stdout.split("[pipeline] plan for", 1)[1].split("\n[pipeline 1/", 1)[0]
    return {line.split()[0]: line.split()[1] for line in plan.splitlines()[1:] if line.strip()}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.integration
def test_main_job_runs_every_stage_then_reruns_exactly_what_a_change_touches(tmp_path):
    out = tmp_path / "run"
    first = _submitted(out)
    assert {n for n, v in _plan(first).items() if v == "RUN"} >= set(NAMES[1:])  # world: maybe cached
    for stage in STAGES:
        assert (out / stage / "manifest.json").is_file(), stage
        assert re.search(rf"\] .*: running -> {re.escape(str(out / stage))}", first), stage
    report = out / "benchmark" / "report.md"
    assert f"report: {report.resolve()}" in first
    text = report.read_text()
    for heading in ("Figure 1", "Table 1", "Table 2", "Table 3", "Table 7", "stages", "tiny world"):
        assert heading in text, heading
    png = next((out / "benchmark").glob("*.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results = json.loads((out / "benchmark" / "results.json").read_text())
    audits = [arm["audit"] for arm in results["arms"].values() if arm.get("audit")]
    assert audits and all(a["exact"] == a["prompts"] for a in audits)
    for plugged in ("toy_bigram", "prompt_lookup"):  # the plugin's arm and the model-free one
        arm = results["arms"][plugged]
        assert arm["audit"]["exact"] == arm["audit"]["prompts"] > 0, plugged
    assert "| Toy bigram (3 tokens) |" in text and "| Prompt lookup (8 tokens" in text
    # AR against an independent engine: HF generate (vLLM's reference from a Ray worker:
    # tests/jobs/test_benchmark.py; this job's four benchmark runs would start it four times)
    (ref,) = results["references"]
    assert ref["engine"] == "hf_generate" and ref["checked"] == ref["identical"] > 0
    assert "AR's greedy outputs against independent engines'" in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert [row["stage"] for row in manifest["stages"]] == list(NAMES)
    assert [row["path"] for row in manifest["stages"]][1:] == [str(out / s) for s in STAGES]
    assert all(row["wall_seconds"] is not None and row["peak_rss_mib"] for row in manifest["stages"])
    # Legible: the job's own lines only (library and Ray output in the per-stage logs).
    assert not re.search(r"WARNING|INFO|DeepSpeed|TrainingReport|Traceback", first), first[-3000:]
    for name in NAMES[1:]:
        assert (out / "logs" / f"{name}.log").stat().st_size > 0, name
    assert "Ray" in (out / "logs" / "generate.log").read_text()

    # the DFlash recipe ablation beside the main job: its variant trains, and the main job's plan
    # then reruns only the benchmark
    ablation = _pipeline(out / "recipe_ablation", "--artifacts", str(out), job="jobs.recipe_ablation")
    assert "| DFlash without its anchors |" in ablation, ablation[-3000:]
    beside = _pipeline(out, "--dry-run")
    assert {n for n, v in _plan(beside).items() if v == "RUN"} == {"benchmark"}, beside

    mtp_before = (out / "fastmtp" / "manifest.json").read_text()
    changed = _pipeline(out, "--set", "peftbd.lora_r=4")
    runs = {name for name, verdict in _plan(changed).items() if verdict == "RUN"}
    assert runs == {"train_peftbd", "benchmark"}, changed
    assert "peftbd.lora_r 8 -> 4" in changed
    assert json.loads((out / "peftbd" / "adapter" / "adapter_config.json").read_text())["r"] == 4
    assert (out / "fastmtp" / "manifest.json").read_text() == mtp_before  # untouched
    assert "DFlash recipe ablation" in (out / "benchmark" / "report.md").read_text()

    dry = _pipeline(out, "--set", "peftbd.lora_r=4", "--set", "data.max_new_tokens=20", "--dry-run")
    assert {n for n, v in _plan(dry).items() if v == "RUN"} == set(NAMES[1:]) - {"cost_profile"}

    again = _pipeline(out, "--set", "peftbd.lora_r=4")
    assert set(_plan(again).values()) == {"skip"}
    assert again.count("current, skipped") == len(NAMES)
