"""Prompt sources: which source a `data.source` value names, how one raw record of it becomes a
tokenized prompt (or a counted bad row) for the generate stage, and the first n prompts of a
JSON-lines source (the placement job, the engine speed check).

Sources: `embedded:tiny` (the tiny world's corpus.jsonl), a local TULU-3-schema `.jsonl` or
`.parquet` (file or directory; rows `{id, messages: [{role, content}], source}`), a hub dataset id
(e.g. `allenai/tulu-3-sft-mixture`) and `spec-bench:PATH` (Spec-Bench `question.jsonl`:
`{question_id, category, turns}`; the first turn is the user message, `category` is kept).
JSON-lines files are parsed here, line by line, so a malformed line is a counted bad row rather
than a failed read.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedTokenizerBase

from peftbd.config import EMBEDDED_TINY, Config, cache_root
from peftbd.data.chat import BadRow, encode_prompt, prompt_messages
from peftbd.data.content_hash import source_digests
from peftbd.errors import UserError

SPEC_BENCH_PREFIX = "spec-bench:"
KINDS = ("jsonl", "parquet", "hub", "spec_bench")

PREPARED_SCHEMA = pa.schema([
    pa.field("id", pa.string()),
    pa.field("source", pa.string()),
    pa.field("category", pa.string()),
    pa.field("prompt_ids", pa.list_(pa.int32())),
    pa.field("drop_reason", pa.string()),  # null for a usable prompt
])
"""One prepared record: a tokenized prompt, or the reason it was dropped (then `id` may be null)."""


class SourceError(UserError, ValueError):
    """A `data.source` value that names no readable source; the message says how to fix it."""


@dataclass(frozen=True)
class Source:
    """A resolved prompt source: `kind` (one of KINDS), `location` (path or hub id), `name` (as given)."""

    kind: str
    location: str
    name: str

    def signature(self, cache_dir: Path | None = None) -> dict[str, Any]:
        """What identifies the source's content, for stage fingerprints: a local source's kind
        and each file's relative name, size and sha256 (`peftbd.data.content_hash`; hashes kept
        in `cache_dir`), not where it lies, so an edited file reruns and a moved one does not; a
        hub dataset by its id (its revision is not pinned)."""
        path = Path(self.location)
        if self.kind == "hub" or not path.exists():
            return {"kind": self.kind, "location": self.location}
        return {"kind": self.kind,
                "files": [list(dataclasses.astuple(d)) for d in source_digests(path, cache_dir)]}

    @property
    def is_json_lines(self) -> bool:
        """Records are raw JSON lines (parsed by `parse_record`), not already-parsed rows."""
        return self.kind in ("jsonl", "spec_bench")


def source_identity(cfg: Config, source: str | None = None) -> Any:
    """What a stage fingerprint records of the prompt source `source` (default
    `cfg.data.source`): `embedded:tiny` as named (the world is an upstream artifact, or its
    config decides it), any other source by its `Source.signature` (local files: their
    content hashes, kept under the cache dir)."""
    name = source or cfg.data.source
    if name == EMBEDDED_TINY:
        return name
    return resolve_source(cfg, name).signature(cache_root(cfg.paths.cache_dir))


def resolve_source(cfg: Config, source: str | None = None) -> Source:
    """The source named by `source` (default `cfg.data.source`); fails at once if it is unreadable
    (a missing path, or a hub id while the hub is unreachable)."""
    name = source or cfg.data.source
    if name == EMBEDDED_TINY:  # resolved, not built (the world stage builds it)
        from peftbd.tiny_world.location import locate_tiny_world

        world = locate_tiny_world(cfg.tiny_world, cfg.paths.cache_dir)
        return Source("jsonl", str(world.corpus_path), name)
    if name.startswith(SPEC_BENCH_PREFIX):
        return spec_bench_source(name[len(SPEC_BENCH_PREFIX):])
    path = Path(name).expanduser()
    kind = _local_kind(path)
    if kind is None and path.is_dir():
        raise SourceError(
            f"data.source={name!r}: directory {str(path)!r} holds no *.parquet or *.jsonl files"
        )
    if kind is not None:
        if not path.exists():
            raise SourceError(f"data.source={name!r}: {str(path)!r} does not exist")
        if not os.access(path, os.R_OK):
            raise SourceError(f"data.source={name!r}: {str(path)!r} is not readable")
        _check_content(kind, path, name)
        return Source(kind, str(path), name)
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        check_hub_reachable(name)
        return Source("hub", name, name)
    raise SourceError(
        f"data.source={name!r} is not a source; use {EMBEDDED_TINY}, a TULU-3-schema .jsonl or "
        f".parquet file or directory, a hub dataset id (owner/name), or spec-bench:PATH"
    )


def spec_bench_source(path: str | Path) -> Source:
    """The source `spec-bench:PATH`, PATH being Spec-Bench's question.jsonl; fails if it is no file."""
    name, file = f"{SPEC_BENCH_PREFIX}{path}", Path(path).expanduser()
    if not file.is_file():
        raise SourceError(
            f"data.source={name!r}: {str(file)!r} is not a file; give the path of Spec-Bench's "
            f"question.jsonl, e.g. spec-bench:../shared/data/spec_bench/question.jsonl"
        )
    _check_content("jsonl", file, name)
    return Source("spec_bench", str(file), name)


def _local_kind(path: Path) -> str | None:
    suffixes = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}
    if path.suffix in suffixes:
        return suffixes[path.suffix]
    if path.is_dir():
        for kind in ("parquet", "jsonl"):
            if any(path.rglob(f"*.{kind}")):
                return kind
    return None


TULU_COLUMNS = ("id", "messages")
"""The columns a TULU-3-schema parquet source must have (`source` is optional)."""


def _check_content(kind: str, path: Path, name: str) -> None:
    """Fail in one line on a local source with nothing to read: empty JSON-lines files, parquet
    without rows or without the TULU-3 columns (read from the files' metadata only)."""
    files = sorted(path.rglob(f"*.{kind}")) if path.is_dir() else [path]
    if kind == "jsonl":
        if all(f.stat().st_size == 0 for f in files):
            raise SourceError(f"data.source={name!r}: {str(path)!r} is empty (no JSON lines); "
                              f"give TULU-3-schema rows {{id, messages, source}}, one per line")
        return
    try:
        parquet = [pq.ParquetFile(f) for f in files]
    except (OSError, pa.ArrowException) as exc:
        raise SourceError(f"data.source={name!r}: cannot read parquet {str(path)!r}: {exc}") from exc
    columns = {c for p in parquet for c in p.schema_arrow.names}
    missing = [c for c in TULU_COLUMNS if c not in columns]
    if missing:
        raise SourceError(
            f"data.source={name!r}: parquet {str(path)!r} has no column {', '.join(missing)} (its "
            f"columns: {', '.join(sorted(columns)) or 'none'}); expected TULU-3-schema rows "
            f"{{id, messages, source}}"
        )
    if sum(p.metadata.num_rows for p in parquet) == 0:
        raise SourceError(f"data.source={name!r}: parquet {str(path)!r} holds no rows")


def check_hub_reachable(dataset_id: str, timeout_s: float = 10.0) -> None:
    """Fail fast (instead of minutes of retries) when the hub is unreachable and not in offline mode."""
    from huggingface_hub import HfApi, constants

    if constants.HF_HUB_OFFLINE:
        return
    try:
        HfApi().dataset_info(dataset_id, timeout=timeout_s)
    except Exception as exc:  # noqa: BLE001 - any transport or HTTP error means the same here
        raise SourceError(
            f"data.source={dataset_id!r}: cannot reach the Hugging Face hub "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). Download it "
            f"where there is network (`hf download {dataset_id} --repo-type dataset --local-dir "
            f"/data/{dataset_id.split('/')[-1]}`), copy it here and run with "
            f"--source /data/{dataset_id.split('/')[-1]}/data (its parquet files); or, if it is "
            f"already in the local HF cache, set HF_HUB_OFFLINE=1"
        ) from exc


def parse_record(source: Source, record: dict[str, Any]) -> dict[str, Any]:
    """A raw record (`{"text": line}` for JSON-lines sources) as `{id, source, category, messages}`;
    raises `BadRow` (blank_line, invalid_json, not_an_object, missing_id)."""
    if source.is_json_lines:
        if not record["text"].strip():
            raise BadRow("blank_line")
        try:
            record = json.loads(record["text"])
        except json.JSONDecodeError as exc:
            raise BadRow("invalid_json", str(exc)) from exc
    if not isinstance(record, dict):
        raise BadRow("not_an_object", type(record).__name__)
    if source.kind == "spec_bench":
        return _spec_bench_row(record)
    row_id = record.get("id")
    if row_id is None or str(row_id) == "":
        raise BadRow("missing_id")
    origin, category = record.get("source"), record.get("category")
    return {
        "id": str(row_id),
        "source": str(origin) if origin else source.name,
        "category": str(category) if category else None,
        "messages": record.get("messages"),
    }


def _spec_bench_row(record: dict[str, Any]) -> dict[str, Any]:
    if record.get("question_id") is None:
        raise BadRow("missing_id")
    turns = record.get("turns")
    messages = [{"role": "user", "content": turns[0]}] if isinstance(turns, list) and turns else None
    category = record.get("category")
    return {
        "id": f"spec-bench-{record['question_id']}",
        "source": "spec-bench",
        "category": str(category) if category is not None else None,
        "messages": messages,
    }


def prepare_record(
    tokenizer: PreTrainedTokenizerBase, source: Source, record: dict[str, Any], max_prompt_len: int
) -> dict[str, Any]:
    """A raw record as a PREPARED_SCHEMA row: its prompt (turns before the first assistant turn,
    rendered with the chat template) tokenized, or `drop_reason` set and the prompt empty."""
    row: dict[str, Any] = {"id": None, "source": source.name, "category": None}
    try:
        row.update(parse_record(source, record))
        ids = encode_prompt(tokenizer, prompt_messages(row.pop("messages")))
        if len(ids) > max_prompt_len:
            raise BadRow("prompt_too_long", f"{len(ids)} > data.max_prompt_len={max_prompt_len}")
    except BadRow as bad:
        row.pop("messages", None)
        return {**row, "prompt_ids": [], "drop_reason": bad.reason}
    return {**row, "prompt_ids": ids, "drop_reason": None}


def prepare_records(
    tokenizer: PreTrainedTokenizerBase,
    source: Source,
    records: Iterable[dict[str, Any]],
    max_prompt_len: int,
) -> pa.Table:
    """`prepare_record` over a batch of raw records, as a PREPARED_SCHEMA table."""
    rows = [prepare_record(tokenizer, source, r, max_prompt_len) for r in records]
    return pa.Table.from_pylist(rows, schema=PREPARED_SCHEMA)


def first_prompts(tokenizer: PreTrainedTokenizerBase, source: Source, n: int,
                  max_prompt_len: int) -> list[list[int]]:
    """Token ids of the first `n` usable prompts of a JSON-lines source (the embedded corpus, a
    TULU-schema .jsonl or Spec-Bench), chat template applied; scans at most 50 n lines."""
    if not source.is_json_lines:
        raise SourceError(
            f"data.source={source.name!r}: prompts are read from JSON-lines sources only; use "
            f"{EMBEDDED_TINY}, a TULU-schema .jsonl file or spec-bench:PATH"
        )
    prompts: list[list[int]] = []
    with open(source.location, encoding="utf-8") as f:
        for line in itertools.islice((line for line in f if line.strip()), 50 * n):
            row = prepare_record(tokenizer, source, {"text": line}, max_prompt_len)
            if not row["drop_reason"]:
                prompts.append(row["prompt_ids"])
            if len(prompts) == n:
                break
    if not prompts:
        raise SourceError(f"no usable prompt in {source.location!r}")
    return prompts


def load_hub_dataset(source: Source, split: str, limit: int | None = None) -> Any:
    """The hub dataset `source.location` (a `datasets.Dataset`), first `limit` rows if given."""
    import datasets

    return datasets.load_dataset(source.location, split=f"{split}[:{limit}]" if limit else split)
