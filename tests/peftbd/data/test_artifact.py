"""The artifact schema, its reader and the deterministic split assignment (no Ray)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq

import pytest

from peftbd.data.artifact import (
    ARTIFACT_SCHEMA,
    ArtifactError,
    assign_splits,
    balanced,
    plan_splits,
    read_split,
    split_sizes,
    write_split,
)
from peftbd.manifest import write_manifest


def _rows(split: str, n: int) -> pa.Table:
    return pa.Table.from_pylist([
        {"id": f"r{i}", "source": "s", "split": split, "prompt_ids": [1, 2], "continuation_ids": [3],
         "prompt_len": 2, "continuation_len": 1, "finish_reason": "eos", "category": None}
        for i in range(n)
    ])


def test_write_then_read_split_round_trips_with_declared_schema(tmp_path):
    write_split(tmp_path, "val", _rows("val", 3))
    write_manifest(tmp_path, {})
    table = read_split(tmp_path, "val")
    assert table.schema.equals(ARTIFACT_SCHEMA)
    assert table.column("id").to_pylist() == ["r0", "r1", "r2"]


def test_read_split_names_missing_columns(tmp_path):
    pq.write_table(_rows("train", 2).drop_columns(["continuation_ids", "finish_reason"]),
                   tmp_path / "train.parquet")
    write_manifest(tmp_path, {})
    with pytest.raises(ArtifactError, match="continuation_ids, finish_reason"):
        read_split(tmp_path, "train")


def test_read_split_refuses_unfinished_artifact_and_unknown_split(tmp_path):
    write_split(tmp_path, "test", _rows("test", 1))
    with pytest.raises(ArtifactError, match="not a finished generate artifact"):
        read_split(tmp_path, "test")
    with pytest.raises(ArtifactError, match="'dev' is not one of"):
        read_split(tmp_path, "dev")


def test_write_split_rejects_rows_of_another_split(tmp_path):
    with pytest.raises(ArtifactError, match="train"):
        write_split(tmp_path, "val", _rows("train", 1))


def test_assign_splits_exact_sizes_deterministic_and_order_free():
    ids = [f"row-{i}" for i in range(100)]
    a = assign_splits(ids, train=50, val=10, test=5, seed=0)
    b = assign_splits(reversed(ids), train=50, val=10, test=5, seed=0)
    assert a == b
    counts = {s: sum(v == s for v in a.values()) for s in ("train", "val", "test")}
    assert counts == {"train": 50, "val": 10, "test": 5}
    assert assign_splits(ids, 50, 10, 5, seed=1) != a


def test_held_out_splits_are_stratified_with_equal_shares_per_category():
    cats = ["recall"] * 150 + ["grounded"] * 149 + ["formulaic"] * 149
    ids = [f"row-{i}" for i in range(len(cats))]
    category_of = dict(zip(ids, cats))
    a = assign_splits(ids, train=328, val=48, test=72, seed=0, categories=category_of)
    for split, each in (("val", 16), ("test", 24)):
        counts = Counter(category_of[i] for i, s in a.items() if s == split)
        assert counts == {"recall": each, "grounded": each, "formulaic": each}
    assert Counter(a.values()) == {"train": 328, "val": 48, "test": 72}
    assert a == assign_splits(list(reversed(ids)), 328, 48, 72, 0, category_of)  # order-free
    # a category too small for its share gives the rest to the others
    small = {**{f"s-{i}": "small" for i in range(5)}, **{f"b-{i}": "big" for i in range(50)}}
    b = assign_splits(small, train=0, val=0, test=20, seed=0, categories=small)
    assert Counter(small[i] for i in b) == {"small": 5, "big": 15}
    # without categories: one stratum, the unstratified assignment
    assert assign_splits(ids, 50, 10, 5, 0, None) == assign_splits(ids, 50, 10, 5, 0, {})


def test_balanced_shares_round_robin_within_what_each_stratum_has():
    assert balanced(10, {"a": 100, "b": 100, "c": 100}) == {"a": 4, "b": 3, "c": 3}
    assert balanced(10, {"a": 1, "b": 100}) == {"a": 1, "b": 9}
    assert balanced(10, {"a": 2, "b": 3}) == {"a": 2, "b": 3}


def test_split_sizes_scale_down_proportionally():
    assert split_sizes(5000, 1200, 48, 48) == {"train": 1200, "val": 48, "test": 48}
    assert split_sizes(30, 1200, 48, 48) == {"train": 28, "val": 1, "test": 1}
    assert split_sizes(480, 0, 0, 480) == {"train": 0, "val": 0, "test": 480}
    assert split_sizes(0, 10, 1, 1) == {"train": 0, "val": 0, "test": 0}


def test_plan_splits_counts_drops_and_removes_every_row_of_a_duplicated_id():
    ids = ["a", "b", "dup", "dup", None, "c", "d"]
    reasons = [None, None, None, None, "invalid_json", "prompt_too_long", None]
    plan = plan_splits(ids, reasons, train=10, val=0, test=0, seed=0)
    assert plan.dropped == {"duplicate_id": 2, "invalid_json": 1, "prompt_too_long": 1}
    assert (plan.rows_read, plan.usable) == (7, 3)
    assert plan.splits == {"a": "train", "b": "train", "d": "train"}
