"""The sha256 of a local source's bytes: streamed in chunks, remembered per file identity.

A stage that reads a user's file must rerun when its bytes change, whatever its path, size or
mtime say (an edit that keeps the size and restores the mtime included), and must not rerun when
the same bytes move elsewhere. So the fingerprint holds the content hash. Hashing streams
`CHUNK` bytes at a time (constant memory; a 1 GB parquet is a few seconds), and the hash is kept
in `<cache>/content_hashes/` keyed by the file's identity (path, size, mtime_ns, ctime_ns, inode):
an unchanged file is not read again. The kernel sets ctime on every write and on every mtime
change (`os.utime` cannot set it back), so any edit misses the cache. A file changed less than
`SETTLE_NS` before it was hashed is not remembered: timestamps are coarse (a write in the same
clock tick as the hash could keep them), so such a file is hashed again next time (as git treats
a "racily clean" file).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CHUNK = 1 << 20
SETTLE_NS = 2_000_000_000
CACHE_SUBDIR = "content_hashes"


@dataclass(frozen=True)
class FileIdentity:
    """What the cache keys a file's hash by; any write changes `ctime_ns`."""

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> FileIdentity:
        st = path.stat()
        return cls(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@dataclass(frozen=True)
class FileDigest:
    """One file of a source: its path relative to the source (`.` for a file source), size, sha256."""

    name: str
    size: int
    sha256: str


def sha256_file(path: Path) -> str:
    """The sha256 of the file's bytes, read `CHUNK` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path, cache_dir: Path | None = None) -> str:
    """The sha256 of `path`, from `cache_dir` when the file is unchanged since it was hashed."""
    ident = FileIdentity.of(path)
    entry = _entry_path(cache_dir, ident.path) if cache_dir is not None else None
    if entry is not None:
        try:
            cached = json.loads(entry.read_text())
            if cached.get("identity") == asdict(ident):
                return cached["sha256"]
        except (OSError, ValueError):
            pass  # no entry yet, or a torn one: hash again
    started = time.time_ns()
    sha = sha256_file(path)
    settled = max(ident.mtime_ns, ident.ctime_ns) < started - SETTLE_NS
    if entry is not None and settled and FileIdentity.of(path) == ident:
        _write_entry(entry, {"identity": asdict(ident), "sha256": sha})
    return sha


def source_digests(path: Path, cache_dir: Path | None = None) -> list[FileDigest]:
    """A `FileDigest` per file of a file or directory source (every file below a directory,
    sorted by relative path: shard names decide the read order)."""
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        return [FileDigest(f.relative_to(path).as_posix(), f.stat().st_size, file_sha256(f, cache_dir))
                for f in files]
    return [FileDigest(".", path.stat().st_size, file_sha256(path, cache_dir))]


def _entry_path(cache_dir: Path, resolved: str) -> Path:
    return cache_dir / CACHE_SUBDIR / f"{hashlib.sha256(resolved.encode()).hexdigest()[:32]}.json"


def _write_entry(entry: Path, record: dict[str, object]) -> None:
    """Write atomically (temp + rename); a cache that cannot be written only costs a rehash."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_name(f"{entry.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, entry)
    except OSError as exc:
        log.debug("content hash cache %s not written: %s", entry, exc)
