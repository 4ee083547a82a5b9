"""Prompt sources: resolving `data.source`, parsing records, bad rows by reason (no Ray)."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from peftbd.config import load_config
from peftbd.data.chat import encode_prompt
from peftbd.data.sources import (
    PREPARED_SCHEMA,
    Source,
    SourceError,
    first_prompts,
    prepare_record,
    prepare_records,
    resolve_source,
)
from peftbd.models.loading import load_tokenizer

JSONL = Source("jsonl", "rows.jsonl", "rows.jsonl")
PARQUET = Source("parquet", "rows.parquet", "rows.parquet")
SPEC = Source("spec_bench", "question.jsonl", "spec-bench:question.jsonl")


@pytest.fixture(scope="module")
def tok(tiny_cfg, tiny_world):
    return load_tokenizer(tiny_cfg)


def _line(obj) -> dict:
    return {"text": obj if isinstance(obj, str) else json.dumps(obj)}


def test_resolve_embedded_local_spec_bench_and_hub(tiny_cfg, tiny_world, tmp_path, monkeypatch):
    monkeypatch.setattr("peftbd.data.sources.check_hub_reachable", lambda dataset_id: None)
    src = resolve_source(tiny_cfg)
    assert (src.kind, src.location) == ("jsonl", str(tiny_world.corpus_path))
    pq.write_table(pa.table({"id": ["a"], "messages": [[{"role": "user", "content": "hi"}]]}),
                   tmp_path / "a.parquet")
    assert resolve_source(tiny_cfg, str(tmp_path / "a.parquet")).kind == "parquet"
    assert resolve_source(tiny_cfg, str(tmp_path)).kind == "parquet"  # a directory of parts
    (tmp_path / "q.jsonl").write_text("{}\n")
    assert resolve_source(tiny_cfg, f"spec-bench:{tmp_path / 'q.jsonl'}").kind == "spec_bench"
    assert resolve_source(tiny_cfg, "allenai/tulu-3-sft-mixture").kind == "hub"


@pytest.mark.parametrize("name, match", [
    ("/nope/rows.jsonl", "'/nope/rows.jsonl' does not exist"),
    ("spec-bench:/nope/question.jsonl", "is not a file"),
    ("not-a-source", "is not a source"),
])
def test_unreadable_source_fails_at_once_naming_it(tiny_cfg, name, match):
    with pytest.raises(SourceError, match=match):
        resolve_source(tiny_cfg, name)


def _empty_jsonl(tmp_path):
    (tmp_path / "rows.jsonl").write_text("")
    return "rows.jsonl", "is empty (no JSON lines); give TULU-3-schema rows {id, messages, source}, one per line"


def _parquet(table: pa.Table, message: str):
    def make(tmp_path):
        pq.write_table(table, tmp_path / "rows.parquet")
        return "rows.parquet", message
    return make


@pytest.mark.parametrize("make", [
    _empty_jsonl,
    _parquet(pa.table({"id": pa.array([], pa.string()), "messages": pa.array([], pa.string())}),
             "holds no rows"),
    _parquet(pa.table({}), "has no column id, messages (its columns: none); expected "
                           "TULU-3-schema rows {id, messages, source}"),
    _parquet(pa.table({"text": ["a"], "id": ["1"]}), "has no column messages (its columns: id, "
                                                     "text); expected TULU-3-schema rows {id, messages, source}"),
])
def test_a_source_with_nothing_to_read_fails_in_one_line_before_any_work(tiny_cfg, tmp_path, make):
    name, message = make(tmp_path)
    with pytest.raises(SourceError) as err:
        resolve_source(tiny_cfg, str(tmp_path / name))
    kind = "" if name.endswith("jsonl") else "parquet "
    assert str(err.value) == (f"data.source={str(tmp_path / name)!r}: {kind}"
                              f"{str(tmp_path / name)!r} {message}")


def test_local_directory_without_rows_is_not_mistaken_for_a_hub_id(tiny_cfg, tmp_path, monkeypatch):
    (tmp_path / "data" / "tulu").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError, match="holds no .*parquet or .*jsonl files"):
        resolve_source(tiny_cfg, "data/tulu")


def test_unreachable_hub_fails_fast_saying_how_to_use_a_local_copy(monkeypatch):
    from huggingface_hub import HfApi

    def offline(*args, **kwargs):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(HfApi, "dataset_info", offline)
    with pytest.raises(SourceError, match="--source /data/tulu-3-sft-mixture/data .*HF_HUB_OFFLINE"):
        resolve_source(load_config("qwen3-0.6b"))


def test_good_rows_keep_system_turn_and_stop_before_first_assistant(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "More"}]
    row = prepare_record(tok, JSONL, _line({"id": "a", "messages": messages, "source": "x"}), 512)
    assert row["drop_reason"] is None
    assert (row["id"], row["source"], row["category"]) == ("a", "x", None)
    tagged = prepare_record(tok, JSONL, _line({"id": "b", "messages": messages, "category": "recall"}), 512)
    assert tagged["category"] == "recall"  # a row that names its category keeps it (the tiny world's)
    assert row["prompt_ids"] == encode_prompt(tok, messages[:2])
    parquet_row = prepare_record(tok, PARQUET, {"id": "a", "messages": messages}, 512)
    assert parquet_row["prompt_ids"] == row["prompt_ids"]
    assert parquet_row["source"] == "rows.parquet"  # no `source` field: the source's name


@pytest.mark.parametrize("record, reason", [
    (_line("{not json"), "invalid_json"),
    (_line(""), "blank_line"),
    (_line(" \t"), "blank_line"),
    (_line([1, 2]), "not_an_object"),
    (_line({"messages": [{"role": "user", "content": "hi"}]}), "missing_id"),
    (_line({"id": "a"}), "no_messages"),
    (_line({"id": "a", "messages": []}), "no_messages"),
    (_line({"id": "a", "messages": [{"role": "system", "content": "s"}]}), "no_user_turn"),
    (_line({"id": "a", "messages": [{"role": "assistant", "content": "x"},
                                    {"role": "user", "content": "late"}]}), "no_user_turn"),
    (_line({"id": "a", "messages": [{"role": "user", "content": 3}]}), "non_string_content"),
    (_line({"id": "a", "messages": [{"role": "user", "content": "  \n"}]}), "empty_text"),
    (_line({"id": "a", "messages": [{"role": "user", "content": "word " * 2400}]}), "prompt_too_long"),
])
def test_bad_rows_are_dropped_with_their_reason(tok, record, reason):
    row = prepare_record(tok, JSONL, record, max_prompt_len=96)
    assert (row["drop_reason"], row["prompt_ids"]) == (reason, [])


def test_spec_bench_first_turn_is_the_user_message_and_category_is_kept(tok):
    q = {"question_id": 81, "category": "writing", "turns": ["Write a poem.", "Now shorter."]}
    row = prepare_record(tok, SPEC, _line(q), 512)
    assert (row["id"], row["source"], row["category"]) == ("spec-bench-81", "spec-bench", "writing")
    assert row["prompt_ids"] == encode_prompt(tok, [{"role": "user", "content": "Write a poem."}])
    empty = prepare_record(tok, SPEC, _line({"question_id": 1, "category": "qa", "turns": []}), 512)
    assert empty["drop_reason"] == "no_messages"


def test_prepare_records_has_the_declared_schema(tok):
    table = prepare_records(tok, JSONL, [_line("{"), _line({"id": "a", "messages": [
        {"role": "user", "content": "hi"}]})], 96)
    assert table.schema.equals(PREPARED_SCHEMA)
    assert table["drop_reason"].to_pylist() == ["invalid_json", None]


def test_real_spec_bench_file_renders_every_question(tok, spec_bench_path):
    src = Source("spec_bench", str(spec_bench_path), f"spec-bench:{spec_bench_path}")
    lines = [{"text": line} for line in spec_bench_path.read_text().splitlines() if line.strip()]
    table = prepare_records(tok, src, lines, max_prompt_len=100_000)
    assert table.num_rows == 480
    assert table["drop_reason"].null_count == 480
    assert len(set(table["id"].to_pylist())) == 480
    assert len(set(table["category"].to_pylist())) == 13


def test_first_prompts_skip_blank_and_dropped_lines(tok, tmp_path):
    def row(i: int, text: str) -> str:
        return json.dumps({"id": str(i), "messages": [{"role": "user", "content": text}]})

    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join([row(0, "hi"), "", "{not json", row(1, "word " * 2400), row(2, "yo"),
                               row(3, "more")]) + "\n")
    src = Source("jsonl", str(path), str(path))
    hi, yo = (encode_prompt(tok, [{"role": "user", "content": t}]) for t in ("hi", "yo"))
    assert first_prompts(tok, src, 2, max_prompt_len=96) == [hi, yo]
    with pytest.raises(SourceError, match="JSON-lines"):
        first_prompts(tok, PARQUET, 2, max_prompt_len=96)
    with pytest.raises(SourceError, match="no usable prompt"):
        first_prompts(tok, src, 2, max_prompt_len=1)


def test_signature_changes_when_a_local_source_is_edited(tiny_cfg, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text("{}\n")
    before = resolve_source(tiny_cfg, str(path)).signature()
    path.write_text("{}\n{}\n")
    assert resolve_source(tiny_cfg, str(path)).signature() != before
    assert Source("hub", "owner/name", "owner/name").signature() == {"kind": "hub", "location": "owner/name"}
