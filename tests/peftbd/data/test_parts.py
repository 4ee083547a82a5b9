"""The resumable part store of the generate stage and its throughput bookkeeping (no Ray)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from peftbd.data.parts import WORK_SCHEMA, PartStore, actor_peaks, throughput


def _work_rows(ids: list[str], actor: str = "a", start: float = 1.0, end: float = 2.0,
               cpu: float = 0.5, gpu: float | None = None) -> pa.Table:
    return pa.Table.from_pylist([
        {"id": i, "source": "s", "split": "train", "prompt_ids": [1, 2], "continuation_ids": [3, 4],
         "prompt_len": 2, "continuation_len": 2, "finish_reason": "eos", "category": None,
         "actor": actor, "batch_start": start, "batch_end": end, "batch_cpu_seconds": cpu,
         "actor_rss_mib": 3.0, "actor_gpu_mib": gpu, "actor_dtype": "bfloat16"}
        for i in ids
    ], schema=WORK_SCHEMA)


def test_part_store_resumes_from_whole_parts_and_ignores_temporaries(tmp_path):
    store = PartStore(tmp_path / "work", "fp1")
    store.write(_work_rows(["a", "b"]))
    store.write(_work_rows(["c"]))
    (tmp_path / "work" / "part-x.tmp").write_bytes(b"half a part")  # a killed writer's leftover
    again = PartStore(tmp_path / "work", "fp1")
    assert again.done_ids() == {"a", "b", "c"}
    assert not list((tmp_path / "work").glob("*.tmp"))
    table = again.read()
    assert table.schema.equals(WORK_SCHEMA) and sorted(table["id"].to_pylist()) == ["a", "b", "c"]


def test_part_store_discards_parts_made_for_other_inputs(tmp_path):
    PartStore(tmp_path / "work", "fp1").write(_work_rows(["a"]))
    assert PartStore(tmp_path / "work", "fp2").done_ids() == set()


def test_read_complete_refuses_gaps_and_a_split_mismatch(tmp_path):
    store = PartStore(tmp_path / "work", "fp")
    store.write(_work_rows(["a", "b"]))
    assert store.read_complete({"a": "train", "b": "train"}).num_rows == 2
    with pytest.raises(RuntimeError, match="plan has 3 .1 planned ids missing, 0 not planned"):
        store.read_complete({"a": "train", "b": "train", "c": "val"})
    with pytest.raises(RuntimeError, match="disagree with the split plan"):
        store.read_complete({"a": "train", "b": "val"})


def test_identical_copies_are_kept_once_and_differing_copies_fail_naming_the_ids(tmp_path):
    """Two runs into one work dir (the issue: all their copies identical, yet every later run
    failed); their bookkeeping differs, their rows do not."""
    store = PartStore(tmp_path / "work", "fp")
    store.write(_work_rows(["a", "b", "c"], actor="run1"))
    store.write(_work_rows(["c", "b"], actor="run2", start=5.0, end=6.0))
    store.write(_work_rows(["d"], actor="run2"))
    table = store.read_complete({i: "train" for i in "abcd"})
    assert sorted(table["id"].to_pylist()) == ["a", "b", "c", "d"]
    assert table.schema.equals(WORK_SCHEMA)

    changed = _work_rows(["b", "d"]).set_column(4, "continuation_ids", pa.array([[9], [3, 4]]))
    store.write(changed)  # b's continuation differs from run1's copy; d's copy is identical
    with pytest.raises(RuntimeError, match="differing copies of 1 row ids: b;"):
        store.read_complete({i: "train" for i in "abcd"})


def test_throughput_per_actor_and_over_the_span():
    table = pa.concat_tables([
        _work_rows(["a", "b"], actor="x", start=10.0, end=11.0, cpu=0.5),
        _work_rows(["c"], actor="x", start=11.0, end=12.0, cpu=0.5),
        _work_rows(["d", "e"], actor="y", start=10.5, end=12.5, cpu=1.5, gpu=700.0),
    ])
    tp = throughput(table, stage_seconds=5.0)
    assert (tp["generated_rows"], tp["generated_tokens"]) == (5, 10)
    assert tp["tokens_per_s"] == 4.0 and tp["stage_tokens_per_s"] == 2.0  # 10 tokens / 2.5 s, / 5 s
    assert tp["tokens_per_cpu_s"] == 4.0  # 10 tokens / 2.5 CPU-seconds
    assert tp["per_actor"]["x"] == {
        "rows": 3, "tokens": 6, "busy_seconds": 2.0, "cpu_seconds": 1.0, "batches": 2,
        "peak_rss_mib": 3.0, "peak_gpu_mib": None, "dtype": "bfloat16", "tokens_per_s": 3.0,
        "tokens_per_cpu_s": 6.0}
    assert tp["per_actor"]["y"]["tokens_per_s"] == 2.0
    peaks = actor_peaks(tp["per_actor"])  # the stage manifest's `workers` section
    assert peaks.to_dict() == {"workers": 2, "peak_rss_mib": 3.0, "peak_gpu_mib": 700.0,
                               "dtype": "bfloat16"}
