"""Generate's greedy continuations (the engine's greedy AR) equal the verifier's own
single-sequence greedy output, whatever the batching (no Ray)."""

from __future__ import annotations

import json

import pytest
import torch

from peftbd.data.chat import prompt_messages, encode_prompt
from peftbd.data.continuations import greedy_continuations
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier

MAX_NEW = 20


@pytest.fixture(scope="module")
def world(tiny_cfg, tiny_world):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is as fast and immune to a busy machine
    tok = load_tokenizer(tiny_cfg)
    model = load_verifier(tiny_cfg)
    rows = [json.loads(line) for line in tiny_world.corpus_path.read_text().splitlines()[:24]]
    prompts = [encode_prompt(tok, prompt_messages(r["messages"])) for r in rows]
    # replies run ~85-170 tokens: prompts that already hold most of their answer end on EOS
    prompts += [p + tok(r["messages"][-1]["content"])["input_ids"][:-4]
                for p, r in zip(prompts[:8], rows)]
    eos = eos_token_ids(model, tok)
    yield model, tok, eos, prompts, greedy_continuations(model, prompts, MAX_NEW, eos)
    torch.set_num_threads(threads)


def _hf_single(model, prompt, eos, pad_id):
    """Reference: transformers' own greedy generate on the unpadded prompt alone."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                         max_new_tokens=MAX_NEW, eos_token_id=eos, pad_token_id=pad_id)
    gen = out[0, len(prompt):].tolist()
    for i, token in enumerate(gen):  # generate pads rows that stopped early: cut after the stop
        if token in eos:
            return gen[: i + 1]
    return gen


def test_batched_equals_single_sequence_greedy(world):
    model, tok, eos, prompts, batched = world
    reasons = {c.finish_reason for c in batched}
    assert reasons == {"eos", "length"}, "the sample should exercise both stop conditions"
    assert len({len(p) for p in prompts}) > 5, "the sample should mix prompt lengths"
    for prompt, cont in zip(prompts, batched):
        assert cont.ids == _hf_single(model, prompt, eos, tok.pad_token_id)
        if cont.finish_reason == "eos":
            assert cont.ids[-1] in eos and not set(cont.ids[:-1]) & set(eos)
        else:
            assert len(cont.ids) == MAX_NEW and not set(cont.ids) & set(eos)


def test_batching_does_not_change_tokens(world):
    """One at a time, continuous batching (rows join as others finish) and a subset all agree."""
    model, _, eos, prompts, whole = world
    assert greedy_continuations(model, prompts, MAX_NEW, eos, batch_size=1) == whole
    assert greedy_continuations(model, prompts[::-1], MAX_NEW, eos, batch_size=5) == whole[::-1]
    assert greedy_continuations(model, prompts[3:4], MAX_NEW, eos) == whole[3:4]


def test_a_smaller_budget_cuts_the_same_tokens(world):
    model, _, eos, prompts, whole = world
    short = greedy_continuations(model, prompts, 3, eos)
    for s, w in zip(short, whole):
        assert s.ids == w.ids[:3]
        assert s.finish_reason == ("eos" if s.ids[-1] in eos else "length")


def test_empty_and_invalid_inputs(world):
    model, _, eos, prompts, _ = world
    assert greedy_continuations(model, [], MAX_NEW, eos) == []
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_continuations(model, prompts[:1], 0, eos)
    with pytest.raises(ValueError, match="empty"):
        greedy_continuations(model, [[]], MAX_NEW, eos)
