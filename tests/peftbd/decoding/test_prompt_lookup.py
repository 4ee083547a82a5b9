"""The prompt-lookup drafter: its proposals on hand-built contexts, and exact greedy decoding
through the engine (batch 1 and batched) with drafts that the verifier accepts on a copy prompt."""

from __future__ import annotations

import json

import pytest
import torch

from peftbd.data.chat import encode_prompt, prompt_messages
from peftbd.decoding import DecodeState, Drafter, RaggedKV, RowCache, SpeculativeDecoder, decode
from peftbd.decoding.clock import Clock, ForwardLog
from peftbd.methods.prompt_lookup import PromptLookupDrafter, prompt_lookup

CPU = torch.device("cpu")
N = 40  # generated tokens per request in the engine tests
COPY_TASK = "Read this and write it out again"  # the tiny world's copy prompts (a repeated passage)


def state_of(tokens: list[int], prompt_len: int | None = None) -> DecodeState:
    """A request state holding `tokens` (no verifier: the drafter reads only the tokens)."""
    return DecodeState(tokens=list(tokens), prompt_len=len(tokens) if prompt_len is None else prompt_len,
                       max_new_tokens=64, eos_ids=frozenset(), cache=RowCache.empty(RaggedKV([], CPU)),
                       forwards=ForwardLog(Clock(CPU)), device=CPU)


def draft(tokens: list[int], num_tokens: int, min_ngram: int, max_ngram: int,
          max_tokens: int = 100) -> list[int]:
    """The drafter's proposal for one request, checked to be a long (1, k) tensor."""
    drafter = PromptLookupDrafter(num_tokens, min_ngram, max_ngram)
    state = state_of(tokens)
    drafter.start(state)
    (out,) = drafter.propose([state], [max_tokens])
    assert out.dtype == torch.long and out.dim() == 2 and out.shape[0] == 1
    assert out.shape[1] <= min(num_tokens, max_tokens)
    return out[0].tolist()


# ---- proposals on hand-built contexts ----

def test_the_longest_matching_ngram_wins_over_a_more_recent_shorter_one():
    # suffix [1, 2, 3]: as a 3-gram it occurs only at the start (then 9, 9); its last token 3
    # alone occurs more recently (then 8, 8)
    tokens = [1, 2, 3, 9, 9, 5, 3, 8, 8, 1, 2, 3]
    assert draft(tokens, 2, 1, 3) == [9, 9]
    assert draft(tokens, 2, 1, 1) == [8, 8]  # max_ngram=1: only 1-grams, the most recent [3]
    assert draft(tokens, 2, 2, 2) == [9, 9]  # the 2-gram [2, 3] occurs only at the start


def test_the_most_recent_occurrence_is_taken():
    # [4, 5] occurs at 0 (then 1, 2) and at 4 (then 3, 3); vLLM and HF take the earliest
    tokens = [4, 5, 1, 2, 4, 5, 3, 3, 4, 5]
    assert draft(tokens, 2, 1, 2) == [3, 3]
    assert draft(tokens, 4, 1, 2) == [3, 3, 4, 5]  # its continuation runs to the context's end


def test_an_occurrence_cut_short_by_the_context_end_yields_to_one_with_k_tokens():
    # periodic: [1, 2] ends at 2 (then 1, 2, 1, 2) and, overlapping the suffix's period, at 4
    # (then only 1, 2): with k = 4 the earlier one offers all 4 tokens of the same period
    tokens = [7, 1, 2, 1, 2, 1, 2]
    assert draft(tokens, 4, 2, 2) == [1, 2, 1, 2]
    assert draft(tokens, 2, 2, 2) == [1, 2]  # both full: the most recent (same tokens here)
    # every continuation cut short: the longest one (the earliest occurrence), up to the end
    assert draft([1, 2, 1, 2, 1, 2], 5, 2, 2) == [1, 2, 1, 2]


def test_k_is_capped_by_num_tokens_by_max_tokens_and_by_the_context_end():
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert draft(tokens, 3, 1, 2) == [3, 4, 5]  # num_tokens
    assert draft(tokens, 10, 1, 2, max_tokens=2) == [3, 4]  # the engine's max_tokens
    assert draft(tokens, 10, 1, 2) == [3, 4, 5, 6, 7, 1, 2]  # the context ends after 7 tokens
    assert draft(tokens, 10, 1, 2, max_tokens=0) == []  # no budget left: nothing


def test_no_match_proposes_an_empty_long_draft():
    drafter = PromptLookupDrafter(4, 1, 3)
    states = [state_of([1, 2, 3, 4]), state_of([9]), state_of([])]
    for state in states:
        drafter.start(state)
        assert state.drafter_state is None  # nothing per request
    for out in drafter.propose(states, [4, 4, 4]):
        assert out.shape == (1, 0) and out.dtype == torch.long
    assert prompt_lookup([1, 2, 3, 4], 4, 1, 3).shape == (0,)


def test_min_and_max_ngram_bound_the_match():
    # the suffix's longest earlier match is the 1-gram [2] (then 3, 4)
    tokens = [1, 2, 3, 4, 2]
    assert draft(tokens, 2, 1, 3) == [3, 4]
    assert draft(tokens, 2, 2, 3) == []  # min_ngram=2: a 1-gram match does not count
    # a 4-token match: max_ngram caps the n-gram (still found, as a 2-gram, at its most recent)
    tokens = [6, 1, 2, 3, 4, 9, 0, 3, 4, 8, 1, 2, 3, 4]
    assert draft(tokens, 1, 1, 4) == [9]  # [1, 2, 3, 4] at 1..4
    assert draft(tokens, 1, 1, 2) == [8]  # [3, 4]: its most recent occurrence, at 7..8
    assert draft(tokens, 1, 5, 6) == []  # no 5-gram occurs earlier


def test_batched_proposals_are_each_rows_own_and_timed_once():
    drafter = PromptLookupDrafter(3, 1, 2)
    rows = [[4, 5, 1, 2, 4, 5], [1, 2, 3], [7, 7, 7, 7, 7, 8, 9, 7, 8], [1, 2, 3, 1, 2, 3, 1]]
    states = [state_of(r) for r in rows]
    for state in states:
        drafter.start(state)
    out = drafter.propose(states, [3, 3, 1, 0])
    assert [o[0].tolist() for o in out] == [[1, 2, 4], [], [9], []]
    alone = [drafter.propose([s], [m])[0][0].tolist() for s, m in zip(states, [3, 3, 1, 0])]
    assert alone == [o[0].tolist() for o in out]
    assert all(s.forwards.calls["draft"] == 2 for s in states)  # one batched + one alone each
    assert drafter.propose([], []) == []
    with pytest.raises(ValueError, match="2 states but 1 max_tokens"):
        drafter.propose(states[:2], [3])


def test_a_long_context_is_searched_whole():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(100, 150, (200_000,), generator=gen).tolist() + [1, 2, 3, 4]
    tokens[1000:1006] = [1, 2, 3, 4, 11, 12]  # the only earlier [1, 2, 3, 4], far back
    assert prompt_lookup(tokens, 2, 1, 4).tolist() == [11, 12]
    # cut before it: only its last token [4] is left, at the start (a 1-gram match)
    assert prompt_lookup(tokens[1003:], 3, 1, 4).tolist() == [11, 12, tokens[1006]]
    assert prompt_lookup(tokens[1003:], 3, 2, 4).tolist() == []


def reference(tokens: list[int], k: int, min_ngram: int, max_ngram: int) -> list[int]:
    """The rule, spelled out with Python loops."""
    length = len(tokens)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        ends = [e for e in range(n - 1, length - 1) if tokens[e - n + 1 : e + 1] == tokens[-n:]]
        if ends and k > 0:
            full = [e for e in ends if length - 1 - e >= k]
            end = full[-1] if full else ends[0]
            return tokens[end + 1 : end + 1 + k]
    return []


def test_the_vectorised_search_matches_the_rule_spelled_out():
    gen = torch.Generator().manual_seed(0)
    for _ in range(2000):
        length, vocab = (int(x) for x in torch.randint(0, 30, (2,), generator=gen))
        tokens = torch.randint(0, 2 + vocab % 4, (length,), generator=gen).tolist()
        k, lo, extra = (int(x) for x in torch.randint(0, 5, (3,), generator=gen))
        args = (k, lo + 1, lo + 1 + extra)
        assert prompt_lookup(tokens, *args).tolist() == reference(tokens, *args), (tokens, args)


@pytest.mark.parametrize("args,bad", [((0, 1, 2), "num_tokens=0"), ((4, 0, 2), "min_ngram=0"),
                                      ((4, 3, 2), "max_ngram=2 < min_ngram=3")])
def test_bad_arguments_are_named(args, bad):
    with pytest.raises(ValueError, match=bad):
        PromptLookupDrafter(*args)


def test_it_reads_no_verifier_state():
    drafter: Drafter = PromptLookupDrafter(4, 1, 3)
    assert drafter.reads_kv_layers == 0 and drafter.reads_hidden is False
    assert drafter.feature_layers == ()


# ---- through the engine, on the tiny world's verifier ----

@pytest.fixture(scope="module")
def copy_prompts(tiny_world, tokenizer) -> list[list[int]]:
    """The corpus's first two copy prompts: the verifier's reply repeats a passage of the prompt."""
    found = []
    with open(tiny_world.corpus_path) as f:
        for line in f:
            messages = json.loads(line)["messages"]
            if any(m["role"] == "user" and m["content"].startswith(COPY_TASK) for m in messages):
                found.append(encode_prompt(tokenizer, prompt_messages(messages)))
            if len(found) == 2:
                return found
    raise AssertionError(f"the tiny world's corpus has fewer than two {COPY_TASK!r} prompts")


@pytest.fixture(scope="module")
def requests(prompts, open_prompts, copy_prompts) -> list[list[int]]:
    """Copy prompts (lookup drafts most rounds), corpus and open prompts (it drafts less), and a
    short cut (a few tokens: often no match at all)."""
    return copy_prompts + [ids for _, ids in prompts] + open_prompts[:1] + [prompts[0][1][:4]]


@pytest.fixture(scope="module")
def ar_outputs(verifier, eos, requests) -> list[list[int]]:
    decoder = SpeculativeDecoder(verifier, None, eos, N)
    return [decoder.decode(ids).tokens for ids in requests]


def test_greedy_decoding_equals_ar_at_batch_1(verifier, eos, requests, ar_outputs):
    drafter = PromptLookupDrafter(6, 1, 3)
    decoder = SpeculativeDecoder(verifier, drafter, eos, N)
    results = [decoder.decode(ids) for ids in requests]
    assert [r.tokens for r in results] == ar_outputs
    rounds = [r for res in results for r in res.rounds]
    assert any(r.proposed == 0 for r in rounds) and any(r.accepted > 0 for r in rounds)
    for r in rounds:
        assert r.proposed <= 6
        if r.proposed == 0:  # no match: the round is one verifier step, as AR's
            assert (r.accepted, r.emitted) == (0, 1)
    for res in results:  # one timed search per round
        assert res.metrics["forward"]["draft"]["calls"] == len(res.rounds)


@pytest.mark.parametrize("batch_size", [3, 8])
def test_greedy_decoding_equals_ar_batched(verifier, eos, requests, ar_outputs, batch_size):
    """Rows of different lengths and budgets (joining late at batch 3), some drafting, some not
    in the same round: each row decodes exactly its own greedy output."""
    budgets = [N, 17, N, 5, 29, N, 1]
    assert len(budgets) == len(requests)
    decoder = SpeculativeDecoder(verifier, PromptLookupDrafter(5, 2, 4), eos, N)
    results = decoder.decode_many(requests, batch_size, budgets)
    assert [r.tokens for r in results] == [ar[:b] for ar, b in zip(ar_outputs, budgets)]
    rounds = [r for res in results for r in res.rounds]
    assert any(r.proposed == 0 for r in rounds) and any(r.accepted > 0 for r in rounds)


def test_lookup_drafts_are_accepted_on_a_copy_prompt(verifier, eos, copy_prompts, ar_outputs):
    drafter = PromptLookupDrafter(6, 1, 3)
    for ids, truth in zip(copy_prompts, ar_outputs):
        result = decode(verifier, ids, drafter, N, eos)
        assert result.tokens == truth
        # the reply copies the prompt's passage: most rounds emit several tokens (measured
        # ~5.2-5.9 per round on these prompts; AR emits exactly 1)
        assert result.metrics["mean_accepted"] > 2.0, result.metrics["mean_accepted"]
        assert result.metrics["mean_accepted_prefix"] > 1.0
        assert len(result.rounds) < (N - 1) / 2


def test_earliest_takes_vllm_s_occurrence_the_first_of_the_longest_ngram():
    # [4, 5] occurs at 0 (then 1, 2) and at 4 (then 3, 3): vLLM's rule takes the first
    tokens = [4, 5, 1, 2, 4, 5, 3, 3, 4, 5]
    assert prompt_lookup(tokens, 2, 1, 2, "earliest").tolist() == [1, 2]
    assert prompt_lookup(tokens, 2, 1, 2, "recent").tolist() == [3, 3]
    # the longest n-gram still wins over an earlier shorter one: [2, 3] only at 5
    tokens = [3, 7, 7, 1, 1, 2, 3, 6, 6, 2, 3]
    assert prompt_lookup(tokens, 2, 1, 2, "earliest").tolist() == [6, 6]
    drafter = PromptLookupDrafter(2, 1, 2, "earliest")
    state = state_of([4, 5, 1, 2, 4, 5, 3, 3, 4, 5])
    assert drafter.propose([state], [8])[0].tolist() == [[1, 2]]
