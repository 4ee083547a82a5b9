import dataclasses
import json

import pytest
from transformers import AutoTokenizer

from peftbd.config import TinyWorldConfig
from peftbd.tiny_world.build import build_tiny_world

SMALL = TinyWorldConfig(corpus_rows=400, vocab_size=600, train_steps=4, train_batch_size=4,
                        hidden_size=32, num_heads=2, num_kv_heads=1, head_dim=16,
                        intermediate_size=64, num_layers=2)


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("worlds")
    return build_tiny_world(SMALL, root / "a"), build_tiny_world(SMALL, root / "b")


def test_same_seed_gives_identical_corpus_tokenizer_and_weights(two_builds):
    a, b = two_builds
    assert a.manifest()["sha256"] == b.manifest()["sha256"]
    assert a.corpus_path.read_bytes() == b.corpus_path.read_bytes()


def test_other_seed_gives_another_world(tmp_path, two_builds):
    other = build_tiny_world(dataclasses.replace(SMALL, seed=1), tmp_path / "c")
    assert other.manifest()["sha256"]["corpus"] != two_builds[0].manifest()["sha256"]["corpus"]


def test_world_parts_load_with_hf_apis(two_builds):
    world = two_builds[0]
    tok = AutoTokenizer.from_pretrained(world.tokenizer_dir)
    assert tok.mask_token == "<|mask|>" and tok.eos_token == "<|im_end|>"
    rows = [json.loads(line) for line in world.corpus_path.read_text().splitlines()]
    assert len(rows) == SMALL.corpus_rows
    assert all(set(r) == {"id", "messages", "source"} for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)


@pytest.mark.slow
def test_tiny_verifier_learned_far_below_unigram_entropy(tiny_world):
    m = tiny_world.manifest()
    # the 2-core budget trains 400 batches of 8: 0.63x the unigram entropy (prompts included)
    assert m["heldout_loss_nats"] < 0.7 * m["unigram_entropy_nats"], m


def test_length_bucketed_batches_cover_an_epoch_once_and_pad_little():
    import random

    from peftbd.tiny_world.verifier import length_bucketed_batches

    lengths = [random.Random(i).randint(5, 300) for i in range(1000)]
    batches = length_bucketed_batches(lengths, 8, random.Random(0))
    assert sorted(j for b in batches for j in b) == list(range(1000))
    assert batches == length_bucketed_batches(lengths, 8, random.Random(0))  # deterministic
    padded = sum(len(b) * max(lengths[j] for j in b) for b in batches)
    assert padded < 1.1 * sum(lengths)  # a random batching pads to ~1.6x here
