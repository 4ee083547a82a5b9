"""The generate job on a local Ray: tiny end to end, exactness, bad rows, Spec-Bench (resume:
test_generate_resume.py). Small on purpose: tens of rows, a dozen new tokens."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from jobs.generate import generate_call, run_generate
from peftbd.config import load_config
from peftbd.data.artifact import ARTIFACT_SCHEMA, SPLITS, read_split
from peftbd.data.chat import encode_prompt, prompt_messages
from peftbd.data.parts import WORK_SCHEMA, PartStore
from peftbd.decoding import compare
from peftbd.manifest import read_manifest
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.peers.vllm_env import absent_reason
from peftbd.tiny_world.corpus import CATEGORIES

from .conftest import GENERATE_LIMIT, GENERATE_OVERRIDES

pytestmark = pytest.mark.integration


def _rows(artifact: Path) -> dict[str, list[dict]]:
    return {s: read_split(artifact, s).to_pylist() for s in SPLITS}


@pytest.mark.slow  # the reference run: Ray Data's verifier actors (~40 s), the suite's, not the quick loop's
def test_tiny_end_to_end_artifact(reference):
    cfg, out = reference
    manifest = read_manifest(out)
    tables = {s: read_split(out, s) for s in SPLITS}
    assert all(t.schema.equals(ARTIFACT_SCHEMA) for t in tables.values())
    assert {s: t.num_rows for s, t in tables.items()} == {"train": 24, "val": 4, "test": 4}
    assert manifest["counts"]["per_split"] == {"train": 24, "val": 4, "test": 4}
    c, limit = manifest["counts"], manifest["limit"]
    assert c["rows_read"] == limit == 40  # conftest.GENERATE_LIMIT
    assert c["usable"] + sum(manifest["dropped"].values()) == limit
    assert c["unused"] == c["usable"] - 32
    rows = [r for t in tables.values() for r in t.to_pylist()]
    assert len({r["id"] for r in rows}) == 32
    for r in rows:
        assert r["split"] in SPLITS and r["category"] in CATEGORIES and r["source"] == "embedded"
        assert r["prompt_len"] == len(r["prompt_ids"]) <= cfg.data.max_prompt_len
        assert r["continuation_len"] == len(r["continuation_ids"]) <= 12
        assert r["finish_reason"] == "eos" or r["continuation_len"] == 12
    actors = manifest["throughput"]["per_actor"]
    assert sum(a["rows"] for a in actors.values()) == 32
    assert manifest["throughput"]["generated_tokens"] == c["continuation_tokens"]
    assert manifest["wall_seconds"] > 0 and manifest["peak_rss_mib"] > 0
    workers = manifest["workers"]  # the actors' peaks, not the driver's
    assert workers["workers"] == len(actors) and workers["dtype"] == "float32"
    assert workers["peak_rss_mib"] == max(a["peak_rss_mib"] for a in actors.values()) > 0
    assert workers["peak_gpu_mib"] is None  # no GPU here
    # A rerun of a complete artifact is a no-op.
    assert run_generate(cfg, out, limit=limit) == out
    assert read_manifest(out) == manifest


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model: as fast, and immune to a busy machine
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow  # as above
def test_prompts_and_continuations_equal_single_sequence_greedy(reference, tiny_world, one_thread):
    cfg, out = reference
    tok, model = load_tokenizer(cfg), load_verifier(cfg)
    eos = eos_token_ids(model, tok)
    corpus = {row["id"]: row for row in map(json.loads, tiny_world.corpus_path.open())}
    rows = [r for t in _rows(out).values() for r in t]
    # replies run ~75-170 tokens, so at 12 new tokens every row stops on length (the EOS path:
    # tests/peftbd/data/test_continuations.py, prompts that hold most of their answer)
    assert {r["finish_reason"] for r in rows} <= {"eos", "length"}
    assert "length" in {r["finish_reason"] for r in rows}
    for r in rows:
        assert r["prompt_ids"] == encode_prompt(tok, prompt_messages(corpus[r["id"]]["messages"]))
        ids = torch.tensor([r["prompt_ids"]])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=12, eos_token_id=eos, pad_token_id=tok.pad_token_id)
        assert r["continuation_ids"] == gen[0, ids.shape[1]:].tolist()
        assert (r["finish_reason"] == "eos") == (r["continuation_ids"][-1] in eos)


# the quick loop keeps the end-to-end artifact tests above; this source's reading and its
# drops are unit-tested in tests/peftbd/data (test_sources.py, test_artifact.py), so the
# whole generate run over it (a verifier actor start, ~10-20 s) waits for the full suite
@pytest.mark.slow
def test_malformed_rows_are_counted_by_reason(local_ray, tmp_path):
    good = [{"id": f"g{i}", "source": "t", "messages": [
        {"role": "user", "content": f"Count from {i} to {i + 3}."}]} for i in range(6)]
    bad = {
        "invalid_json": ["{oops"],
        "blank_line": ["", "   "],
        "missing_id": [{"messages": [{"role": "user", "content": "hi"}]}],
        "no_messages": [{"id": "b1"}, {"id": "b2", "messages": []}],
        "no_user_turn": [{"id": "b3", "messages": [{"role": "system", "content": "s"}]}],
        "non_string_content": [{"id": "b4", "messages": [{"role": "user", "content": ["x"]}]}],
        "empty_text": [{"id": "b5", "messages": [{"role": "user", "content": " "}]}],
        "prompt_too_long": [{"id": "b6", "messages": [{"role": "user", "content": "w " * 2400}]}],
        "duplicate_id": [{"id": "dup", "messages": [{"role": "user", "content": "a"}]}] * 2,
    }
    lines = [json.dumps(r) for r in good] + [
        r if isinstance(r, str) else json.dumps(r) for rows in bad.values() for r in rows
    ]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(lines) + "\n")
    cfg = load_config("tiny", overrides=["data.max_new_tokens=4", "data.train_size=4",
                                         "data.val_size=1", "data.test_size=1",
                                         "generate.num_actors=1"])
    out = run_generate(cfg, tmp_path / "out", source=str(src))
    manifest = read_manifest(out)
    assert manifest["dropped"] == {k: len(v) for k, v in bad.items()}
    assert sorted(r["id"] for rows in _rows(out).values() for r in rows) == [g["id"] for g in good]


@pytest.mark.slow  # as above: the source resolution is unit-tested in test_sources.py
def test_tulu_parquet_directory_source(local_ray, tmp_path):
    rows = [{"id": f"t{i}", "source": "tulu", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Count to {i}."},
        {"role": "assistant", "content": "1"}]} for i in range(5)]
    rows.append({"id": "empty", "source": "tulu", "messages": []})
    (tmp_path / "data").mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:3]), tmp_path / "data" / "train-0.parquet")
    pq.write_table(pa.Table.from_pylist(rows[3:]), tmp_path / "data" / "train-1.parquet")
    cfg = load_config("tiny", overrides=["data.max_new_tokens=4", "generate.num_actors=1"])
    out = run_generate(cfg, tmp_path / "out", source=str(tmp_path / "data"))
    assert read_manifest(out)["dropped"] == {"no_messages": 1}
    got = [r for t in _rows(out).values() for r in t]
    assert sorted(r["id"] for r in got) == [f"t{i}" for i in range(5)]
    assert {r["source"] for r in got} == {"tulu"}


@pytest.mark.slow  # as above: the rendering is unit-tested (test_sources.py, the real file)
def test_spec_bench_questions_render_and_generate(local_ray, spec_bench_path, tmp_path):
    cfg = load_config("tiny", overrides=[
        "data.max_new_tokens=6", "data.max_prompt_len=512", "data.train_size=0",
        "data.val_size=0", "data.test_size=12", "generate.num_actors=1",
    ])
    out = run_generate(cfg, tmp_path / "sb", source=f"spec-bench:{spec_bench_path}", limit=12)
    rows = read_split(out, "test").to_pylist()
    first = [json.loads(line) for line in spec_bench_path.read_text().splitlines()[:12]]
    assert sorted(r["id"] for r in rows) == sorted(f"spec-bench-{q['question_id']}" for q in first)
    assert Counter(r["category"] for r in rows) == Counter(q["category"] for q in first)
    assert all(r["source"] == "spec-bench" and 1 <= r["continuation_len"] <= 6 for r in rows)
    assert read_split(out, "train").num_rows == read_split(out, "val").num_rows == 0


@pytest.mark.slow  # a vLLM engine actor's start (~20 s) and the run
@pytest.mark.skipif(absent_reason() is not None, reason=str(absent_reason()))
def test_the_vllm_backend_resumes_into_the_engines_artifact(reference, tmp_path):
    """generate.backend=vllm (ray.data.llm; vLLM's CPU build in float32): the reference's artifact,
    row for row and column for column (a reply may differ only from a near tie on, by its top-2
    margin), resumed from half of its rows already in the run's work parts (as after a kill)."""
    cfg, ref = reference
    cfg = load_config("tiny", overrides=[*GENERATE_OVERRIDES, "generate.backend=vllm",
                                         "generate.num_actors=1"])
    out = tmp_path / "vllm"
    call = generate_call(cfg, out, limit=GENERATE_LIMIT)
    expected = {r["id"]: r for rows in _rows(ref).values() for r in rows}
    done = sorted(expected)[::2]
    parts = PartStore(out.with_name(out.name + ".work"), call.inputs().fingerprint)
    parts.write(pa.Table.from_pylist([{**expected[i], "actor": "killed run", "batch_start": 0.0,
                                       "batch_end": 1.0, "batch_cpu_seconds": 0.0, "actor_rss_mib": 0.0,
                                       "actor_gpu_mib": None, "actor_dtype": "float32"} for i in done],
                                     schema=WORK_SCHEMA))
    call.run()
    got = {r["id"]: r for rows in _rows(out).values() for r in rows}
    assert got.keys() == expected.keys()
    verifier = load_verifier(cfg)
    differ = [m for i in sorted(got) if (m := compare(verifier, i, got[i]["prompt_ids"],
                                                      expected[i]["continuation_ids"],
                                                      got[i]["continuation_ids"]))]
    assert len(differ) <= 1 and all(m.top2_margin < 1e-3 for m in differ), differ
    same = [i for i in got if i not in {m.prompt_id for m in differ}]
    assert all(got[i] == expected[i] for i in same)  # every column: split, source, lengths, reason
    m = read_manifest(out)
    assert m["counts"]["resumed_rows"] == len(done) and m["throughput"]["generated_rows"] == len(got) - len(done)
    assert set(m["throughput"]["per_actor"]) == {"vllm"} and m["throughput"]["tokens_per_cpu_s"] is None
