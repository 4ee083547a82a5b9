"""The GPU check's dry run on CPU: every section runs and reports, on the tiny verifier's shape."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from peftbd.decoding.graph_audit import CudaGraphUse, GraphAudit, GraphRecord

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "scripts" / "device_check.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check


def test_a_compiled_cuda_arm_that_replays_no_cuda_graph_fell_back():
    check, cuda, cpu = _script(), torch.device("cuda"), torch.device("cpu")
    replayed = GraphAudit([GraphRecord((3,), (3,))], CudaGraphUse(recordings=1, replays=9))
    assert not check.cuda_graphs(replayed, cuda, True)["fell_back"]
    skipped = GraphAudit([GraphRecord((3,), ())], CudaGraphUse(replays=9))
    assert check.cuda_graphs(skipped, cuda, True)["non_static_mutations"] == [[3]]
    assert check.cuda_graphs(skipped, cuda, True)["fell_back"]
    assert check.cuda_graphs(GraphAudit(), cuda, True)["fell_back"]  # never replayed
    assert not check.cuda_graphs(GraphAudit(), cuda, False)["fell_back"]  # eager: nothing to replay
    assert not check.cuda_graphs(skipped, cpu, True)["fell_back"]  # CPU: no CUDA graphs


@pytest.mark.slow
def test_the_device_check_dry_runs_on_cpu(tiny_world, tmp_path):
    check = _script()
    check.main(["--out", str(tmp_path), "--device", "cpu", "--dtype", "float32", "--quick",
                "--preset", "tiny", "--set", "cost_profile.architecture=model",
                "--set", "cost_profile.early_exit_layers=1", "--fast-path", "off",
                "--world", str(tiny_world.root)])
    result = json.loads((tmp_path / "device_check.json").read_text())
    assert result["cost_profile"]["decode"]["arms"]["peftbd_synthetic"]["exact"]
    decodes = result["synthetic_decodes"]
    arms = ("ar", "peftbd_synthetic", "fastmtp_synthetic", "peftbd_head_synthetic")
    assert set(decodes) == {f"{a} eager batch {b}" for a in arms for b in (1, 16)}
    assert all(d["exact_rows"] == 4 and d["tokens_per_s"] > 0 and d["roofline_verify_ms"] > 0
               for d in decodes.values())
    assert decodes["ar eager batch 1"]["speedup_vs_ar"] == 1.0
    assert all(d["like_for_like"] and set(d["paths"].values()) == {"eager"}
               and d["cuda_graphs"]["graphs_compiled"] == 0 and not d["cuda_graphs"]["fell_back"]
               for d in decodes.values())
    assert result["batched_exactness"]["exact_rows"] == result["batched_exactness"]["rows"]
    assert all(r["exact_rows"] == r["rows"] for r in result["engine_batching"].values())
