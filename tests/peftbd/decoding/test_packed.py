"""Packed, chunked prefill (`peftbd.decoding.packed`): the prompts of a step computed as one
sequence with no padding, cut into forwards of at most `prefill_chunk` tokens, leave every
request exactly as a prefill of it alone does (first token, cache, hidden states, features)."""

from __future__ import annotations

import pytest
import torch

from peftbd.decoding import SpeculativeDecoder, prefill_rows
from peftbd.decoding.packed import Segment, packed_chunks


def test_the_chunks_cover_every_prompt_token_once_in_order():
    chunks = list(packed_chunks([5, 1, 12, 3], 6))
    assert [sum(s.tokens for s in c) for c in chunks] == [6, 6, 6, 3]
    assert chunks[0] == [Segment(0, 0, 5), Segment(1, 0, 1)]
    assert chunks[1:3] == [[Segment(2, 0, 6)], [Segment(2, 6, 12)]]
    with pytest.raises(ValueError, match="decoding.prefill_chunk must be >= 1"):
        list(packed_chunks([3], 0))


@pytest.mark.parametrize("chunk", [512, 7])  # the prompts in one forward; cut across forwards
def test_a_packed_prefill_computes_the_prompt_tokens_and_leaves_each_request_as_alone(
        verifier, prompts, chunk):
    rows = [ids for _, ids in prompts] + [prompts[0][1][:4], prompts[1][1][:1]]
    computed = []
    hook = verifier.get_input_embeddings().register_forward_hook(
        lambda _m, args, _o: computed.append(args[0].numel()))
    try:
        packed = prefill_rows(verifier, rows, [8] * len(rows), feature_layers=(0, 2), chunk=chunk)
    finally:
        hook.remove()
    assert sum(computed) == sum(len(r) for r in rows)  # no padding: the prompt tokens, once
    assert len(computed) == -(-sum(computed) // chunk)
    for row, state in zip(rows, packed):
        alone = prefill_rows(verifier, [row], [8], feature_layers=(0, 2))[0]
        assert state.tokens == alone.tokens
        torch.testing.assert_close(state.hidden, alone.hidden, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(state.features, alone.features, rtol=1e-4, atol=1e-4)
        assert state.cache.get_seq_length() == len(row)
        for (k, v), (k1, v1) in zip(state.cache.committed(), alone.cache.committed()):
            torch.testing.assert_close(k, k1, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(v, v1, rtol=1e-4, atol=1e-4)


def test_a_decoder_decodes_the_same_whatever_its_prefill_chunk(verifier, prompts, eos):
    rows = [ids for _, ids in prompts]
    want = [r.tokens for r in SpeculativeDecoder(verifier, None, eos, 12).decode_many(rows, 3)]
    small = SpeculativeDecoder(verifier, None, eos, 12, prefill_chunk=5)
    assert [r.tokens for r in small.decode_many(rows, 3)] == want
