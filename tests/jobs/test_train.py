"""The two training jobs on a local Ray (CPU workers, gloo, DeepSpeed ZeRO-0; two for the PEFT-BD
run and its resume, one elsewhere): the loss falls,
an interrupted run resumes to the same weights, the outputs load back and decode exactly through
the engine. Small on purpose: 64 train rows, a dozen steps."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import ray
import torch
from peft import PeftModel
from safetensors.torch import load_file

from jobs.ray_env import init_ray
from jobs.train import main
from jobs.train_common import run_train
from jobs.train_failures import NOT_RETRIED
from peftbd.config import apply_override, load_config
from peftbd.data.artifact import ARTIFACT_SCHEMA, ArtifactError, read_split, write_split
from peftbd.data.continuations import greedy_continuations
from peftbd.data.sources import prepare_records, resolve_source
from peftbd.decoding.audit import greedy_audit
from peftbd.decoding.loop import SpeculativeDecoder
from peftbd.decoding.metrics import summarize
from peftbd.decoding.mtp_drafter import MTPDrafter
from peftbd.decoding.peft_bd_drafter import PeftBDDrafter
from peftbd.manifest import read_manifest, write_manifest
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import load_drafter_adapter, set_adapter_enabled
from peftbd.training.evaluate import evaluate
from peftbd.training.examples import collate_sequences, load_training_split
from peftbd.methods import method

TRAIN_ROWS, VAL_ROWS = 64, 8
OPTIM = ["global_batch_size=8", "max_steps=12", "eval_every=3", "checkpoint_every=3", "eval_batches=1"]
OVERRIDES = [f"{section}.optim.{o}" for section in ("peftbd", "fastmtp") for o in OPTIM] + [
    "training.max_failures=1", "data.max_new_tokens=24",
    "training.logits_chunk_rows=16"]  # several checkpointed logits chunks per micro-batch


@pytest.fixture(scope="module")
def cfg():
    return load_config("tiny", overrides=OVERRIDES)


@pytest.fixture(scope="module")
def one_worker(cfg):
    """`cfg` on one training worker, for the tests not about spreading a run over workers (the
    PEFT-BD run and its resume are): one process less to start and import torch into."""
    return apply_override(cfg, "training.num_workers=1")


@pytest.fixture(scope="module")
def artifact(cfg, tiny_world, tmp_path_factory, make_artifact):
    """A small continuation artifact from the generate library (no Ray): greedy verifier
    continuations of the first corpus prompts."""
    tok, model = load_tokenizer(cfg), load_verifier(cfg)
    lines = tiny_world.corpus_path.read_text().splitlines()[:200]
    prepared = prepare_records(tok, resolve_source(cfg), [{"text": x} for x in lines],
                               cfg.data.max_prompt_len).to_pylist()
    rows = [r for r in prepared if r["drop_reason"] is None][: TRAIN_ROWS + VAL_ROWS]
    outs = greedy_continuations(model, [r["prompt_ids"] for r in rows], cfg.data.max_new_tokens,
                                eos_token_ids(model, tok))
    table = pa.Table.from_pylist([
        {**r, "split": "train" if i < TRAIN_ROWS else "val", "continuation_ids": o.ids,
         "prompt_len": len(r["prompt_ids"]), "continuation_len": len(o.ids),
         "finish_reason": o.finish_reason}
        for i, (r, o) in enumerate(zip(rows, outs, strict=True))
    ])

    def write(tmp):
        for split in ("train", "val"):
            write_split(tmp, split, table.filter(pc.equal(table["split"], split)))

    return make_artifact(tmp_path_factory.mktemp("artifacts") / "continuations", write)


@pytest.fixture(scope="module")
def local_ray(tiny_world):
    ray.shutdown()  # a fresh local Ray: an earlier module's (e.g. Serve's) must not hold its CPUs
    init_ray()
    ray.data.DataContext.get_current().print_on_execution_start = False
    yield
    ray.shutdown()


def _untrained_eval(kind: str, cfg, artifact) -> dict:
    """The eval metrics of the freshly initialised drafter on the same val rows, in-process."""
    task = method(kind).task(cfg)
    module = task.build(torch.device("cpu"))
    val, _ = load_training_split(artifact, "val", cfg.peftbd.block_size, cfg.training.seed)
    batch = collate_sequences(val.to_pydict(), load_tokenizer(cfg).pad_token_id)
    return evaluate(task, module, [batch])


def _decode_check(cfg, model, drafter, artifact) -> dict:
    prompts = [(r["id"], r["prompt_ids"]) for r in read_split(artifact, "val").to_pylist()[:4]]
    eos = eos_token_ids(model, load_tokenizer(cfg))
    audit = greedy_audit(model, prompts, drafter, max_new_tokens=24, eos_ids=eos)
    spec = SpeculativeDecoder(model, drafter, eos, 24)
    return {"audit": audit, **summarize([spec.decode(ids) for _, ids in prompts])}


@pytest.fixture(scope="module")
def peftbd_run(local_ray, cfg, artifact, tmp_path_factory):
    return run_train(method("peftbd").recipe, cfg, artifact, tmp_path_factory.mktemp("runs") / "peftbd", resume=False)


@pytest.mark.integration
@pytest.mark.slow
def test_peftbd_loss_falls_and_the_adapter_decodes_exactly(peftbd_run, cfg, artifact):
    manifest = read_manifest(peftbd_run)
    metrics, before = manifest["metrics"], _untrained_eval("peftbd", cfg, artifact)
    assert metrics["eval_loss"] < before["eval_loss"] - 0.5
    assert metrics["eval_loss_t1"] < before["eval_loss_t1"] - 0.5
    assert manifest["training"]["steps"] == 12 and manifest["training"]["workers"] == 2
    assert manifest["data"]["train"]["rows"] == TRAIN_ROWS
    assert manifest["parameters"]["trainable"] < manifest["parameters"]["total"]
    workers, estimate = manifest["workers"], manifest["training"]["memory_estimate"]
    assert workers["workers"] == 2 and workers["peak_rss_mib"] > 0 and workers["dtype"] == "float32"
    assert estimate["micro_batch"] == 4 and estimate["logits_rows"] == 16 and estimate["total_mib"] > 0
    # the learning curve: every eval_every (3) = a quarter, 6 = a half, 9, and the last step
    curve = manifest["learning_curve"]
    assert [(p["step"], p["fraction"]) for p in curve] == [(3, 0.25), (6, 0.5), (9, 0.75), (12, 1.0)]
    tokens = [p["train_tokens"] for p in curve]
    assert 0 < tokens[0] < tokens[1] < tokens[2] < tokens[3] == manifest["training"]["train_tokens"]
    # 8 rows a step, 8 steps an epoch: by step 12 the whole first epoch (every row once) and half
    # of the next are read; one worker's count alone would be 3/4 of an epoch
    train, _ = load_training_split(artifact, "train", cfg.peftbd.block_size, cfg.training.seed)
    epoch = sum(train["prompt_len"].to_pylist()) + sum(train["continuation_len"].to_pylist())
    assert epoch < tokens[3] < 2 * epoch
    lo, hi = curve[-1]["ci95"]
    assert lo < curve[-1]["accepted_prefix_mean"] == metrics["eval_accepted_prefix_mean"] < hi
    assert metrics["eval_accepted_prefix_ci95"] == [lo, hi]
    # each val row's (accepted, rounds), gathered over both workers, kept at the budget marks:
    # one eval batch of 8 rows, the same rows at the half and the end
    assert [len(p["rows"]) for p in curve] == [8, 8, 0, 8]
    assert [r > 0 for _, r in curve[1]["rows"]] == [r > 0 for _, r in curve[3]["rows"]]
    end_rows = curve[3]["rows"]
    assert sum(a for a, _ in end_rows) / sum(r for _, r in end_rows) == pytest.approx(
        metrics["eval_accepted_prefix_mean"])
    assert "eval_row_values" not in metrics  # the curve has them
    assert manifest["still_rising"] in ("yes", "no", "undecided")
    rising = manifest["rising"]
    assert rising["rows"] == sum(r > 0 for _, r in end_rows)
    assert rising["gain"] == pytest.approx(
        curve[3]["accepted_prefix_mean"] - curve[1]["accepted_prefix_mean"])
    adapter = peftbd_run / "adapter"
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    assert any("trainable_tokens_delta" in k for k in weights)  # the mask row is in the adapter
    plain = PeftModel.from_pretrained(load_verifier(cfg), str(adapter))
    model = load_drafter_adapter(load_verifier(cfg), adapter)
    set_adapter_enabled(model, False)  # peft loads it enabled; the engine verifies with it off
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), model.state_dict().values()))
    mask_id = load_tokenizer(cfg).mask_token_id
    check = _decode_check(cfg, model, PeftBDDrafter(model, mask_id, cfg.peftbd.block_size), artifact)
    assert check["audit"]["exact"] == check["audit"]["prompts"] == 4
    assert check["rounds"] > 0


@pytest.mark.integration
@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_adapter(peftbd_run, cfg, artifact, tmp_path_factory):
    # 64 rows / 2 workers / 4 per micro-batch = 8 steps per epoch: the failure after step 6's
    # checkpoint resumes mid-epoch, skips the consumed batches, then crosses into epoch 1.
    out = run_train(method("peftbd").recipe, cfg, artifact, tmp_path_factory.mktemp("runs") / "peftbd_failed",
                    resume=False, fail_once_at_step=6)
    manifest = read_manifest(out)
    assert manifest["training"]["steps"] == 12 and manifest["training"]["steps_run_last_attempt"] == 6
    resumed = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    straight = load_file(str(peftbd_run / "adapter" / "adapter_model.safetensors"))
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[k], straight[k]) for k in straight)
    assert manifest["metrics"] == read_manifest(peftbd_run)["metrics"]
    # the evals before the failure come back from the checkpoint: the whole curve, as straight
    assert manifest["learning_curve"] == read_manifest(peftbd_run)["learning_curve"]


@pytest.mark.integration
@pytest.mark.slow
def test_mtp_loss_falls_and_the_head_decodes_exactly(local_ray, one_worker, artifact, tmp_path_factory):
    cfg = one_worker
    out = run_train(method("fastmtp").recipe, cfg, artifact, tmp_path_factory.mktemp("runs") / "mtp", resume=False)
    manifest = read_manifest(out)
    before = _untrained_eval("fastmtp", cfg, artifact)
    assert manifest["metrics"]["eval_loss"] < before["eval_loss"] - 0.5
    assert len(manifest["metrics"]["eval_step_accuracy"]) == 3
    assert json.loads((out / "mtp_head" / "mtp_head.json").read_text())["hidden_size"] == cfg.tiny_world.hidden_size
    verifier = load_verifier(cfg)
    head = MTPHead.from_pretrained(out / "mtp_head", verifier)
    check = _decode_check(cfg, verifier, MTPDrafter(head, verifier, cfg.fastmtp.num_steps), artifact)
    assert check["audit"]["exact"] == check["audit"]["prompts"] == 4
    # A rerun of a finished run is a no-op (same fingerprint).
    assert run_train(method("fastmtp").recipe, cfg, artifact, out) == out
    assert read_manifest(out) == manifest


def _log_count(text: str) -> int:
    """How often `text` occurs in this Ray session's log files (the controller's among them)."""
    logs = Path(ray._private.worker.global_worker.node.get_logs_dir_path())
    return sum(p.read_text(errors="replace").count(text) for p in logs.rglob("*") if p.is_file())


@pytest.mark.integration
@pytest.mark.slow
def test_a_worker_error_that_cannot_heal_is_raised_at_once_not_retried(local_ray, one_worker, artifact,
                                                                        tmp_path, make_artifact):
    """Val rows with prompt_len 0 fail every attempt the same way in the workers' setup
    (collate_sequences: ArtifactError); with max_failures=1 Ray Train would try twice."""
    val = read_split(artifact, "val")
    broken = make_artifact(tmp_path / "bad_val", lambda tmp: (
        write_split(tmp, "train", read_split(artifact, "train")),
        write_split(tmp, "val", val.set_column(val.schema.get_field_index("prompt_len"), "prompt_len",
                                               pa.array([0] * val.num_rows, pa.int32())))))
    retries_before = _log_count("[FailurePolicy] RETRY")
    with pytest.raises(ArtifactError, match="prompt_len must be >= 1"):
        run_train(method("peftbd").recipe, one_worker, broken, tmp_path / "out")
    time.sleep(3)  # log lines are flushed asynchronously
    assert _log_count(NOT_RETRIED) >= 1
    assert _log_count("[FailurePolicy] RETRY") == retries_before
    assert not (tmp_path / "out").exists()


def test_bad_artifacts_fail_before_training_with_the_problem_named(cfg, artifact, tmp_path,
                                                                  make_artifact):
    train = read_split(artifact, "train")
    broken = make_artifact(tmp_path / "broken", lambda tmp: pq.write_table(
        train.drop_columns(["prompt_len"]), tmp / "train.parquet"))
    with pytest.raises(ArtifactError, match="prompt_len"):
        run_train(method("peftbd").recipe, cfg, broken, tmp_path / "out")
    empty = make_artifact(tmp_path / "empty", lambda tmp: write_split(
        tmp, "train", pa.Table.from_pylist([], schema=ARTIFACT_SCHEMA)))
    with pytest.raises(ArtifactError, match="no row with a non-empty continuation"):
        run_train(method("fastmtp").recipe, cfg, empty, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing published, not even a partial output


def test_empty_continuations_are_skipped_and_counted(cfg, artifact, tmp_path):
    train = read_split(artifact, "train").to_pylist()
    for row in train[:5]:
        row.update(continuation_ids=[], continuation_len=0)
    write_split(tmp_path, "train", pa.Table.from_pylist(train, schema=ARTIFACT_SCHEMA))
    write_manifest(tmp_path, {})
    table, counts = load_training_split(tmp_path, "train", 8, 0)
    assert counts.rows == table.num_rows == TRAIN_ROWS - 5
    assert counts.skipped_empty_continuation == 5


def test_cli_names_a_missing_artifact(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--method", "peftbd", "--data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "out")])
    assert "nowhere" in str(exc.value) and "jobs.generate" in str(exc.value)


@pytest.mark.integration
@pytest.mark.slow
def test_no_train_rows_publishes_an_untrained_drafter_only_when_asked_for(local_ray, one_worker, artifact,
                                                                          tmp_path, make_artifact):
    """An artifact without train rows (data.train_size=0): refused by default; with
    training.allow_untrained the job evaluates and exports the initial head (no step, no train
    data read) and its manifest says untrained and why."""
    val = read_split(artifact, "val")
    no_train = make_artifact(tmp_path / "no_train", lambda tmp: (
        write_split(tmp, "train", pa.Table.from_pylist([], schema=ARTIFACT_SCHEMA)),
        write_split(tmp, "val", val)))
    with pytest.raises(ArtifactError, match="no row with a non-empty continuation .* or set "
                       "training.allow_untrained=true to publish the drafter untrained on purpose"):
        run_train(method("fastmtp").recipe, one_worker, no_train, tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    allowed = apply_override(one_worker, "training.allow_untrained=true")
    out = run_train(method("fastmtp").recipe, allowed, no_train, tmp_path / "out")
    manifest = read_manifest(out)
    assert manifest["untrained"] is True
    assert manifest["untrained_reasons"] == [
        f"the train split has no usable rows (data.train_size={allowed.data.train_size})"]
    assert manifest["training"]["steps"] == 0 and manifest["training"]["steps_per_epoch"] is None
    before = _untrained_eval("fastmtp", allowed, artifact)
    assert manifest["metrics"]["eval_loss"] == pytest.approx(before["eval_loss"], rel=1e-5)
    assert (out / "mtp_head").is_dir()
