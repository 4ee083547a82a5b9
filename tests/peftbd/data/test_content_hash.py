"""Local prompt sources are identified by their bytes (sha256, streamed), not by where they lie:
an edit that keeps path, size and mtime reruns the stage; the same bytes elsewhere do not."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from peftbd.config import load_config
from peftbd.data import content_hash
from peftbd.data.content_hash import FileDigest, file_sha256, sha256_file, source_digests
from peftbd.data.sources import Source


def _row(i: int, text: str) -> str:
    return '{"id": "r%d", "messages": [{"role": "user", "content": "%s"}]}\n' % (i, text)


def _rewrite_keeping_size_and_mtime(path: Path, text: str) -> None:
    st = path.stat()
    assert len(text.encode()) == st.st_size
    time.sleep(0.05)  # past the filesystem's timestamp tick
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_sha256_streams_the_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(content_hash, "CHUNK", 7)  # many chunks
    path = tmp_path / "x.bin"
    path.write_bytes(bytes(range(256)) * 5)
    import hashlib

    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_unchanged_file_is_hashed_once_and_any_write_misses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(content_hash, "SETTLE_NS", 0)  # treat the fresh file as settled
    calls = []
    real = content_hash.sha256_file
    monkeypatch.setattr(content_hash, "sha256_file", lambda p: calls.append(p) or real(p))
    path, cache = tmp_path / "rows.jsonl", tmp_path / "cache"
    path.write_text(_row(0, "aaaa"))
    time.sleep(0.05)
    first = file_sha256(path, cache)
    assert file_sha256(path, cache) == first and len(calls) == 1  # from the cache
    _rewrite_keeping_size_and_mtime(path, _row(0, "bbbb"))
    second = file_sha256(path, cache)
    assert second != first and len(calls) == 2  # ctime moved: hashed again


def test_a_file_changed_just_before_hashing_is_not_remembered(tmp_path, monkeypatch):
    calls = []
    real = content_hash.sha256_file
    monkeypatch.setattr(content_hash, "sha256_file", lambda p: calls.append(p) or real(p))
    path, cache = tmp_path / "rows.jsonl", tmp_path / "cache"
    path.write_text(_row(0, "aaaa"))
    file_sha256(path, cache)
    file_sha256(path, cache)
    assert len(calls) == 2 and not (cache / content_hash.CACHE_SUBDIR).exists()


def test_signature_is_the_content_not_the_location(tmp_path):
    a, b = tmp_path / "a" / "rows.jsonl", tmp_path / "b" / "other.jsonl"
    a.parent.mkdir(), b.parent.mkdir()
    a.write_text(_row(0, "hi")), b.write_text(_row(0, "hi"))
    sig = Source("jsonl", str(a), str(a)).signature(tmp_path / "cache")
    assert sig == Source("jsonl", str(b), str(b)).signature(tmp_path / "cache")
    assert str(tmp_path) not in repr(sig)
    shards = tmp_path / "shards"
    (shards / "sub").mkdir(parents=True)
    (shards / "0.jsonl").write_text(_row(0, "x")), (shards / "sub" / "1.jsonl").write_text(_row(1, "y"))
    digests = source_digests(shards)
    assert [d.name for d in digests] == ["0.jsonl", "sub/1.jsonl"]
    assert digests[1] == FileDigest("sub/1.jsonl", len(_row(1, "y")), sha256_file(shards / "sub" / "1.jsonl"))
    assert Source("hub", "owner/name", "owner/name").signature() == {"kind": "hub", "location": "owner/name"}


def test_generate_reruns_on_new_bytes_under_the_same_path_size_and_mtime(tiny_world, tmp_path):
    """The stage contract: an edit that keeps path, size and mtime reruns generate; the same
    bytes at a new path have the same fingerprint (data.source is where, the content is what)."""
    from jobs.generate import generate_call
    from peftbd.stage import run_stage

    cfg = load_config("tiny")
    path = tmp_path / "rows.jsonl"
    path.write_text(_row(0, "aaaa") + _row(1, "bb"))
    call = generate_call(cfg, tmp_path / "out", source=str(path))
    run_stage(call.inputs(), call.out, lambda tmp, _inputs: {}, call.cfg_dict)  # a stand-in output
    assert generate_call(cfg, tmp_path / "out", source=str(path)).decide().run is False
    moved = tmp_path / "elsewhere" / "copy.jsonl"
    moved.parent.mkdir()
    moved.write_bytes(path.read_bytes())
    assert (generate_call(cfg, tmp_path / "x", source=str(moved)).inputs().fingerprint
            == call.inputs().fingerprint)
    _rewrite_keeping_size_and_mtime(path, _row(0, "cccc") + _row(1, "bb"))
    decision = generate_call(cfg, tmp_path / "out", source=str(path)).decide()
    assert decision.run and decision.reasons == ("source changed",)


@pytest.mark.slow
def test_hashing_a_large_file_is_cheap_and_cached(tmp_path, monkeypatch):
    """256 MiB: streamed in 1 MiB chunks; a second signature reads the cache (SETTLE_NS 0)."""
    monkeypatch.setattr(content_hash, "SETTLE_NS", 0)
    path = tmp_path / "big.parquet"
    with open(path, "wb") as f:
        for i in range(256):
            f.write(os.urandom(1 << 16) * 16)
    time.sleep(0.05)
    start = time.perf_counter()
    first = file_sha256(path, tmp_path / "cache")
    cold = time.perf_counter() - start
    start = time.perf_counter()
    assert file_sha256(path, tmp_path / "cache") == first
    warm = time.perf_counter() - start
    assert warm < 0.05 < cold
    print(f"256 MiB: cold {cold:.2f} s, cached {warm * 1e3:.2f} ms")
