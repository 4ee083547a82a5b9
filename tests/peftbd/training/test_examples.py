"""Training examples: split loading (skip + counts, seeded order), collation, checkpoint identity."""

from __future__ import annotations

import pyarrow as pa
import pytest

from peftbd.data.artifact import ARTIFACT_SCHEMA, ArtifactError, write_split
from peftbd.manifest import write_manifest
from peftbd.training.checkpoint import CheckpointMismatch, TrainState, load_checkpoint
from peftbd.training.examples import collate_sequences, load_training_split


def _artifact(tmp_path, continuation_lens: list[int]):
    rows = [
        {"id": f"r{i}", "source": "s", "split": "train", "prompt_ids": [1, 2, 3],
         "continuation_ids": list(range(10, 10 + n)), "prompt_len": 3, "continuation_len": n,
         "finish_reason": "eos", "category": None}
        for i, n in enumerate(continuation_lens)
    ]
    write_split(tmp_path, "train", pa.Table.from_pylist(rows, schema=ARTIFACT_SCHEMA))
    write_manifest(tmp_path, {})
    return tmp_path


def test_counts_blocks_padded_blocks_and_skipped_rows(tmp_path):
    table, counts = load_training_split(_artifact(tmp_path, [16, 17, 3, 0, 8]), "train", 8, seed=0)
    assert counts.to_dict() == {
        "rows": 4, "skipped_empty_continuation": 1, "continuation_tokens": 44,
        "blocks": 2 + 3 + 1 + 1, "padded_blocks": 2,
    }
    assert sorted(table["id"].to_pylist()) == ["r0", "r1", "r2", "r4"]


def test_order_is_seeded_and_stable(tmp_path):
    art = _artifact(tmp_path, list(range(1, 30)))
    first = load_training_split(art, "train", 8, seed=0)[0]["id"].to_pylist()
    assert first == load_training_split(art, "train", 8, seed=0)[0]["id"].to_pylist()
    assert first != load_training_split(art, "train", 8, seed=1)[0]["id"].to_pylist()


def test_only_empty_continuations_is_an_error(tmp_path):
    with pytest.raises(ArtifactError, match="no row with a non-empty continuation"):
        load_training_split(_artifact(tmp_path, [0, 0]), "train", 8, seed=0)


def test_collate_right_pads_and_keeps_lengths():
    batch = collate_sequences(
        {"id": ["a", "b"], "prompt_ids": [[1, 2], [3]], "continuation_ids": [[4], [5, 6, 7]],
         "prompt_len": [2, 1]}, pad_id=0)
    assert batch.ids.tolist() == [[1, 2, 4, 0], [3, 5, 6, 7]]
    assert batch.lengths.tolist() == [3, 4] and batch.prompt_lens.tolist() == [2, 1]
    with pytest.raises(ArtifactError, match="prompt_len"):
        collate_sequences({"id": ["a"], "prompt_ids": [[]], "continuation_ids": [[1]],
                           "prompt_len": [0]}, pad_id=0)


class _Engine:
    """Stands in for a DeepSpeed engine that loads a checkpoint written by another run."""

    def load_checkpoint(self, path, tag, load_module_strict):
        return path, {"step": 7, "fingerprint": "fp-of-run-a"}


class _OtherShapes:
    """A DeepSpeed engine whose module has other shapes than the checkpoint (e.g. lora_r 16 -> 8)."""

    def load_checkpoint(self, path, tag, load_module_strict):
        raise RuntimeError("Error(s) in loading state_dict for PeftModel:\n\tsize mismatch for "
                           "lora_A.weight: copying a param with shape torch.Size([16, 128])")


def test_a_checkpoint_resumes_only_its_own_run():
    assert load_checkpoint(_Engine(), "ckpt", "fp-of-run-a") == TrainState(step=7)
    with pytest.raises(CheckpointMismatch, match="--no-resume"):
        load_checkpoint(_Engine(), "ckpt", "fp-of-run-b")
    with pytest.raises(CheckpointMismatch, match=r"other shapes .*size mismatch for lora_A.weight.*"
                                                 r"rerun with --no-resume"):
        load_checkpoint(_OtherShapes(), "ckpt", "fp-of-run-a")
