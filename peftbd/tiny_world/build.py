"""The embedded tiny world: corpus, tokenizer and verifier, built once into a cache directory.

Everything is deterministic from `TinyWorldConfig`. The directory is named by the world stage's
fingerprint (`peftbd.layout.WORLD`: that config and the source of the code that builds it), so
changed code builds a new world. The build is a stage (`peftbd.stage`): it writes into a temporary
sibling and renames it into place, so a crashed build never leaves a directory that looks
complete; a file lock makes concurrent callers (Ray actors) wait for one build.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock

from peftbd.config import EMBEDDED_TINY, Config, TinyWorldConfig, cache_root
from peftbd.data.chat import encode_prompt
from peftbd.tiny_world.corpus import build_corpus
from peftbd.layout import WORLD
from peftbd.tiny_world.tokenizer import train_tokenizer
from peftbd.tiny_world.verifier import (
    Example,
    mean_loss,
    tiny_qwen3_config,
    train_tiny_verifier,
    unigram_cross_entropy,
)
from peftbd.stage import StageCall, StageInputs, stage_inputs

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
HELDOUT_ROWS = 160
"""The held-out loss is measured on this many documents, each asked in a phrasing it was not
taught in: how far the verifier's recall carries beyond the exact words it learned."""
BUILD_THREADS = 2
"""The world is always trained with this many torch threads: CPU float reductions can depend on
the thread count, and the weights must not depend on who built them."""


@dataclass(frozen=True)
class TinyWorld:
    """Paths of a built tiny world."""

    root: Path

    @property
    def corpus_path(self) -> Path:
        return self.root / "corpus.jsonl"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    @property
    def verifier_dir(self) -> Path:
        return self.root / "verifier"

    def manifest(self) -> dict:
        return json.loads((self.root / MANIFEST).read_text())


def uses_tiny_world(cfg: Config) -> bool:
    """The verifier or the prompts come from the embedded tiny world."""
    return EMBEDDED_TINY in (cfg.model.name_or_path, cfg.data.source)


def tiny_world_dir(tw: TinyWorldConfig, cache_dir: str) -> Path:
    """The directory of the world that `tw` (and this code) describes, under the cache
    (`cache_root(cache_dir)`)."""
    inputs = stage_inputs(WORLD, {"tiny_world": dataclasses.asdict(tw)}, {})
    return cache_root(cache_dir) / f"tiny-world-{inputs.fingerprint[:12]}"


def world_call(tw: TinyWorldConfig, cache_dir: str) -> StageCall:
    """The world stage: builds the world of `tw` into its cache directory."""
    def build(tmp: Path, inputs: StageInputs) -> dict:
        from peftbd.tiny_world.shipped import copy_shipped

        manifest = (tw.shipped and copy_shipped(inputs.fingerprint, tmp)) or build_tiny_world(tw, tmp).manifest()
        return {**manifest, "run_id": world_run_id(manifest)}

    return StageCall(WORLD, {"tiny_world": dataclasses.asdict(tw)}, tiny_world_dir(tw, cache_dir),
                     {}, build)


def ensure_tiny_world(tw: TinyWorldConfig, cache_dir: str) -> TinyWorld:
    """Return the tiny world of `tw`, building it first if the cache does not hold it."""
    call = world_call(tw, cache_dir)
    call.out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(call.out) + ".lock"):
        if not (call.out / MANIFEST).is_file():
            call.run()
    return TinyWorld(call.out)


def world_run_id(manifest: dict) -> str:
    """A world's identity is its content: the same corpus, tokenizer and weights, the same run."""
    digest = json.dumps(manifest["sha256"], sort_keys=True).encode()
    return hashlib.sha256(digest).hexdigest()[:16]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_tiny_world(tw: TinyWorldConfig, root: Path) -> TinyWorld:
    """Build corpus, tokenizer and trained verifier into `root` and write the manifest."""
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        return _build(tw, root)
    finally:
        torch.set_num_threads(caller_threads)


def _build(tw: TinyWorldConfig, root: Path) -> TinyWorld:
    start = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    world = TinyWorld(root)

    corpus = build_corpus(tw.seed, tw.corpus_rows, tw.phrasings)
    with world.corpus_path.open("w") as f:
        for row in corpus.rows:
            f.write(json.dumps(row) + "\n")
    log.info("tiny world: %d corpus rows, each taught in %d phrasings", len(corpus.rows), tw.phrasings)

    tokenizer = train_tokenizer(
        ("\n".join(f"{m['role']}\n{m['content']}" for m in conv) for conv in corpus.training),
        tw.vocab_size,
    )
    tokenizer.save_pretrained(world.tokenizer_dir)

    def encode(conv: list[dict[str, str]]) -> Example:
        prompt = encode_prompt(tokenizer, [m for m in conv if m["role"] != "assistant"])
        reply = tokenizer(conv[-1]["content"], add_special_tokens=False)["input_ids"]
        return Example(prompt + reply + [tokenizer.eos_token_id], len(prompt))

    train = [encode(conv) for conv in corpus.training]
    heldout = [encode(conv) for conv in corpus.unseen[:HELDOUT_ROWS]]

    vocab = ((len(tokenizer) + 63) // 64) * 64
    eos_ids = [tokenizer.eos_token_id, tokenizer.pad_token_id]
    config = tiny_qwen3_config(tw, vocab, eos_ids, tokenizer.pad_token_id)
    model, steps = train_tiny_verifier(tw, config, train, heldout, tokenizer.pad_token_id)
    model.generation_config.eos_token_id = eos_ids
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(world.verifier_dir)

    manifest = {
        "tiny_world": dataclasses.asdict(tw),
        "corpus_rows": len(corpus.rows),
        "training_conversations": len(train),
        "vocab_size": len(tokenizer),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_steps": steps,
        "heldout_sequences": len(heldout),
        "heldout_loss_nats": mean_loss(model, heldout, tokenizer.pad_token_id),
        "unigram_entropy_nats": unigram_cross_entropy(train, heldout, len(tokenizer)),
        "sha256": {
            "corpus": _sha256(world.corpus_path),
            "tokenizer": _sha256(world.tokenizer_dir / "tokenizer.json"),
            "verifier": _sha256(world.verifier_dir / "model.safetensors"),
        },
        "torch_threads": BUILD_THREADS,
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2))
    log.info(
        "tiny world built in %.0fs: held-out loss %.3f vs unigram %.3f nats",
        manifest["build_seconds"], manifest["heldout_loss_nats"], manifest["unigram_entropy_nats"],
    )
    return world
