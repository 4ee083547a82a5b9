import dataclasses
import json

import pytest
from transformers import AutoTokenizer

from peftbd.config import load_config
from peftbd.tiny_world.build import build_tiny_world

# every stage of a build at a few seconds' size (short rows, one phrasing): the tests below compare
# builds, they do not judge the world
SMALL = dataclasses.replace(load_config("tiny").tiny_world, corpus_rows=48, phrasings=1,
                            vocab_size=600, train_steps=4, train_batch_size=4, train_seq_len=64,
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
    assert all(set(r) == {"id", "messages", "source", "category"} for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)


@pytest.mark.slow
def test_tiny_verifier_recalls_its_documents(tiny_world):
    m = tiny_world.manifest()
    # every text taught in 3 phrasings and scored in a 4th: 0.006x the unigram entropy
    assert m["heldout_loss_nats"] < 0.2 * m["unigram_entropy_nats"], m


@pytest.mark.slow
def test_tiny_verifier_replies_are_in_the_papers_regime(tiny_world):
    """Greedy replies to the corpus's prompts at 256 new tokens: long (mean >= 100, p10 >= 32)
    and text, not loops (issue 11's regime; the artifact's manifest records the same stats)."""
    from transformers import AutoModelForCausalLM

    from peftbd.data.chat import encode_prompt
    from peftbd.data.continuations import greedy_continuations
    from peftbd.data.reply_stats import reply_stats

    tok = AutoTokenizer.from_pretrained(tiny_world.tokenizer_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_world.verifier_dir).eval()
    rows = [json.loads(line) for line in tiny_world.corpus_path.read_text().splitlines()[:96]]
    prompts = [encode_prompt(tok, r["messages"][:-1]) for r in rows]
    replies = [c.ids for c in greedy_continuations(model, prompts, 256, [tok.eos_token_id])]
    stats = reply_stats(replies)
    assert stats["mean_tokens"] >= 100 and stats["p10_tokens"] >= 32, stats
    assert stats["loop_share"] < 0.1, stats


def test_length_bucketed_batches_cover_an_epoch_once_and_pad_little():
    import random

    from peftbd.tiny_world.verifier import length_bucketed_batches

    lengths = [random.Random(i).randint(5, 300) for i in range(1000)]
    batches = length_bucketed_batches(lengths, 8, random.Random(0))
    assert sorted(j for b in batches for j in b) == list(range(1000))
    assert batches == length_bucketed_batches(lengths, 8, random.Random(0))  # deterministic
    padded = sum(len(b) * max(lengths[j] for j in b) for b in batches)
    assert padded < 1.1 * sum(lengths)  # a random batching pads to ~1.6x here
