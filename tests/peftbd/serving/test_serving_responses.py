"""Response bodies parse as the official `openai` client's types; SSE framing; text deltas."""

from __future__ import annotations

import json

import pytest
from openai.types import Completion as OpenAICompletion
from openai.types.chat import ChatCompletion as OpenAIChat
from openai.types.chat import ChatCompletionChunk as OpenAIChunk

from peftbd.methods import serving_names
from peftbd.serving.responses import SSE_DONE, chunk, full_response, model_list, sse, usage, usage_chunk
from peftbd.serving.schemas import SpecStats
from peftbd.serving.text_stream import TextStream
from peftbd.serving.validation import GenerationSpec


def _spec(kind: str) -> GenerationSpec:
    return GenerationSpec(
        request_id="req-1", kind=kind, model="peftbd-tiny", method="peftbd",
        prompt_ids=[5, 6, 7], max_new_tokens=4, stream=True, include_usage=True,
    )


STATS = SpecStats(method="peftbd", rounds=2, proposed_tokens=16, accepted_tokens=2,
                  tokens_per_round=2.0, acceptance_rate=0.125, draft_ms=3.0, verify_ms=4.0)


def test_full_responses_parse_as_openai_types():
    use = usage(_spec("completions"), 4, STATS)
    assert (use.prompt_tokens, use.completion_tokens, use.total_tokens) == (3, 4, 7)
    comp = OpenAICompletion.model_validate(
        full_response(_spec("completions"), "abc", "length", use).model_dump()
    )
    assert (comp.choices[0].text, comp.choices[0].finish_reason) == ("abc", "length")
    assert comp.usage.model_extra["speculative"]["tokens_per_round"] == 2.0
    chat = OpenAIChat.model_validate(full_response(_spec("chat"), "hi", "stop", use).model_dump())
    assert (chat.choices[0].message.content, chat.choices[0].message.role) == ("hi", "assistant")


def test_chunks_parse_as_openai_types_and_frame_as_sse():
    first = chunk(_spec("chat"), "he", role=True)
    event = sse(first)
    assert event.startswith("data: ") and event.endswith("\n\n")
    parsed = OpenAIChunk.model_validate(json.loads(event[len("data: "):]))
    assert (parsed.choices[0].delta.role, parsed.choices[0].delta.content) == ("assistant", "he")
    last = OpenAIChunk.model_validate(chunk(_spec("chat"), None, finish_reason="stop").model_dump())
    assert last.choices[0].finish_reason == "stop"
    use = OpenAIChunk.model_validate(
        usage_chunk(_spec("chat"), usage(_spec("chat"), 4, STATS)).model_dump()
    )
    assert use.choices == [] and use.usage.total_tokens == 7
    # mid-stream completion chunks carry finish_reason null (the client builds them leniently)
    assert chunk(_spec("completions"), "x").model_dump()["choices"][0] == {
        "index": 0, "text": "x", "finish_reason": None, "logprobs": None}
    done = OpenAICompletion.model_validate(
        chunk(_spec("completions"), "", finish_reason="length").model_dump()
    )
    assert done.choices[0].finish_reason == "length"
    assert SSE_DONE == "data: [DONE]\n\n"


def test_model_list_has_one_id_per_method():
    ids = [m.id for m in model_list("peftbd-tiny", created=0).data]
    assert ids[:5] == ["peftbd-tiny", "peftbd-tiny:ar", "peftbd-tiny:peftbd", "peftbd-tiny:fastmtp",
                       "peftbd-tiny:peftbd_head"]
    assert ids[5:] == [f"peftbd-tiny:{m}" for m in serving_names()[4:]]  # methods registered since


@pytest.fixture(scope="module")
def tok(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    return load_tokenizer(tiny_cfg)


def test_text_deltas_concatenate_to_the_final_text(tok):
    text = "Ünïcödé → works, tuples (a, b) — fine. 日本"
    ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    stream = TextStream(tok)
    deltas = [stream.push([t]) for t in ids]
    deltas.append(stream.finish())
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in d for d in deltas)


def _streamed(tok, text: str, stop: tuple[str, ...], step: int) -> tuple[str, TextStream]:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    stream = TextStream(tok, stop)
    out = ""
    for i in range(0, len(ids), step):
        out += stream.push(ids[i:i + step])
        if stream.stopped:
            break
    return out + stream.finish(), stream


@pytest.mark.parametrize("step", [1, 2, 3, 50])
def test_a_stop_sequence_split_across_pushes_never_leaks(tok, step):
    text = "alpha ST beta STOP gamma STOP"
    out, stream = _streamed(tok, text, ("STOP", "never"), step)
    assert out == "alpha ST beta " and stream.stopped
    # the kept tokens end with the one that completed the stop sequence (vLLM counts it)
    assert "STOP" in tok.decode(stream.ids) and "STOP" not in tok.decode(stream.ids[:-1])


def test_held_back_stop_prefix_is_released_when_no_stop_follows(tok):
    out, stream = _streamed(tok, "it ends with ST", ("STOP",), 1)
    assert out == "it ends with ST" and not stream.stopped
    out, _ = _streamed(tok, "first match wins: b then a", ("a", "b"), 1)
    assert out == "first m"
