"""Request validation without Ray: every refusal names its field; accepted requests become specs."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from peftbd.config import ConfigError, load_config
from peftbd.data.chat import encode_prompt
from peftbd.serving.validation import (
    NEUTRAL,
    RequestError,
    build_spec,
    check_serving_config,
    parse_body,
    read_body,
    resolve_method,
)

MODEL = "peftbd-tiny"


@pytest.fixture(scope="module")
def serving():
    return load_config("tiny").serving


@pytest.fixture(scope="module")
def tok(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    return load_tokenizer(tiny_cfg)


def _spec(body: dict, tok, serving, kind="completions"):
    req = parse_body(json.dumps(body).encode(), kind, serving)
    return build_spec(req, kind, tok, serving, request_id="cmpl-test")


def _refusal(body, tok, serving, kind="completions") -> RequestError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(RequestError) as info:
        build_spec(parse_body(raw, kind, serving), kind, tok, serving, request_id="x")
    return info.value


def test_text_prompt_becomes_token_ids(tok, serving):
    spec = _spec({"model": MODEL, "prompt": "The list type", "max_tokens": 5}, tok, serving)
    assert spec.prompt_ids == tok("The list type", add_special_tokens=False)["input_ids"]
    assert (spec.max_new_tokens, spec.method, spec.stream) == (5, serving.default_method, False)


def test_token_id_prompt_and_batch_of_one(tok, serving):
    ids = tok("hello world", add_special_tokens=False)["input_ids"]
    assert _spec({"model": MODEL, "prompt": ids}, tok, serving).prompt_ids == ids
    assert _spec({"model": MODEL, "prompt": [ids]}, tok, serving).prompt_ids == ids
    assert _spec({"model": MODEL, "prompt": ["hello world"]}, tok, serving).prompt_ids == ids


def test_chat_messages_use_the_chat_template(tok, serving):
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is a tuple?"}]}]
    spec = _spec({"model": MODEL, "messages": messages, "max_completion_tokens": 7,
                  "stream": True, "stream_options": {"include_usage": True}}, tok, serving, "chat")
    expected = encode_prompt(tok, [messages[0], {"role": "user", "content": "What is a tuple?"}])
    assert spec.prompt_ids == expected
    assert (spec.kind, spec.max_new_tokens, spec.stream, spec.include_usage) == ("chat", 7, True, True)


def test_max_tokens_defaults_to_the_cap(tok, serving):
    assert _spec({"model": MODEL, "prompt": "x"}, tok, serving).max_new_tokens == serving.max_tokens_cap


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": MODEL, "prompt": "x", "max_tokens": "8"}, "max_tokens", "valid integer"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens", "greater than"),
        ({"model": MODEL, "prompt": "x", "stream": "yes"}, "stream", "boolean"),
        ({"model": MODEL, "prompt": "x", "logprobs": 2}, "logprobs", "no log probabilities"),
        ({"model": MODEL, "prompt": "x", "logprobz": 2}, "logprobz", "unknown field"),
        ({"prompt": "x"}, "model", "required"),
        ({"model": MODEL, "prompt": [1, "a"]}, "prompt", "list of token ids"),
        ({"model": MODEL, "prompt": ""}, "prompt", "empty"),
        ({"model": MODEL, "prompt": [10**7]}, "prompt", "ids in [0,"),
        ({"model": MODEL, "prompt": "x", "method": "medusa"}, "method", "'peftbd'"),
        ({"model": MODEL, "prompt": "x", "temperature": 2.5}, "temperature", "less than or equal to 2"),
        ({"model": MODEL, "prompt": "x", "top_p": 0}, "top_p", "greater than 0"),
        ({"model": MODEL, "prompt": "x", "top_k": -2}, "top_k", "positive count"),
        ({"model": MODEL, "prompt": "x", "n": 2}, "n", "one choice per request"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 10_000}, "max_tokens", "serving.max_tokens_cap"),
        ({"model": MODEL, "prompt": "word " * 2400}, "prompt", "serving.max_prompt_tokens"),
        ({"model": f"{MODEL}:ar", "prompt": "x", "method": "fastmtp"}, "method", "contradicts"),
        ({"model": f"{MODEL}:peftbd", "prompt": "x", "method": "peftbd_head"}, "method",
         "contradicts"),
    ],
)
def test_bad_completion_requests_name_the_field(tok, serving, body, param, words):
    err = _refusal(body, tok, serving)
    assert (err.status, err.param) == (400, param)
    assert words in err.message
    assert err.body()["error"]["param"] == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"model": MODEL, "messages": [{"role": "system", "content": "hi"}]}, "messages"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
          "max_completion_tokens": 4}, "max_completion_tokens"),
    ],
)
def test_bad_chat_requests_name_the_field(tok, serving, body, param):
    err = _refusal(body, tok, serving, kind="chat")
    assert (err.status, err.param) == (400, param)


def test_malformed_json_oversized_body_and_unknown_model(tok, serving):
    assert "not valid JSON" in _refusal(b'{"model": ', tok, serving).message
    assert "JSON object" in _refusal(b"[1, 2]", tok, serving).message
    big = json.dumps({"model": MODEL, "prompt": "x" * serving.max_body_bytes}).encode()
    assert _refusal(big, tok, serving).status == 413
    err = _refusal({"model": "gpt-4", "prompt": "x"}, tok, serving)
    assert (err.status, err.param) == (404, "model")
    err = _refusal({"model": f"{MODEL}:peftbd_heads", "prompt": "x"}, tok, serving)
    assert err.status == 404 and f"'{MODEL}:peftbd_head'" in err.message  # the ids it lists


def test_method_from_model_suffix_or_field(serving):
    assert resolve_method(MODEL, None, MODEL, "peftbd") == "peftbd"
    assert resolve_method(f"{MODEL}:fastmtp", None, MODEL, "peftbd") == "fastmtp"
    assert resolve_method(MODEL, "ar", MODEL, "peftbd") == "ar"
    assert resolve_method(f"{MODEL}:ar", "ar", MODEL, "peftbd") == "ar"
    assert resolve_method(f"{MODEL}:peftbd_head", None, MODEL, "peftbd") == "peftbd_head"
    assert resolve_method(MODEL, "peftbd_head", MODEL, "ar") == "peftbd_head"


def test_serving_config_is_checked_at_startup(serving):
    check_serving_config(serving)
    bad = dataclasses.replace(serving, default_method="greedy")  # no registered method's name
    with pytest.raises(ConfigError, match="serving.default_method': 'greedy' is not one of .*'peftbd'"):
        check_serving_config(bad)
    bad = dataclasses.replace(serving, placement_methods=("ar", "medusa"))
    with pytest.raises(ConfigError, match="serving.placement_methods': 'medusa'"):
        check_serving_config(bad)


@pytest.mark.parametrize(
    ("raw", "kind", "param"),
    [
        (b'{"model": "peftbd-tiny", "messages": [{"role": "user", "content": "\\ud800 x"}]}', "chat",
         "messages[0].content"),
        (b'{"model": "peftbd-tiny", "prompt": "\\udfff"}', "completions", "prompt"),
        (b'{"model": "peftbd-tiny", "prompt": "x", "stop": ["a", "\\ud83d"]}', "completions",
         "stop[1]"),
        (b'{"model": "peftbd-tiny", "prompt": "x", "\\ud800": 1}', "completions", None),
    ],
)
def test_lone_surrogates_are_a_400_naming_the_field(tok, serving, raw, kind, param):
    err = _refusal(raw, tok, serving, kind)
    assert (err.status, err.param) == (400, param)
    assert "surrogate" in err.message


def test_a_streamed_body_is_refused_as_soon_as_it_crosses_the_cap(serving):
    read = []

    async def chunks():
        for i in range(1000):  # 64 MB if read to the end
            read.append(i)
            yield b"x" * 65536

    with pytest.raises(RequestError) as info:
        asyncio.run(read_body(chunks(), serving))
    assert info.value.status == 413 and "serving.max_body_bytes" in info.value.message
    assert len(read) == serving.max_body_bytes // 65536 + 1  # stopped at the chunk that crossed

    async def small():
        yield b'{"model": '
        yield b'"m"}'

    assert asyncio.run(read_body(small(), serving)) == b'{"model": "m"}'


NEUTRAL_BODY = {"presence_penalty": 0, "frequency_penalty": 0.0, "repetition_penalty": 1,
                "seed": 1234, "user": "someone", "logit_bias": None, "top_k": -1, "min_p": 0,
                "temperature": 0, "top_p": 1, "n": 1}


def test_neutral_values_of_common_fields_are_accepted(tok, serving):
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **NEUTRAL_BODY,
            "logit_bias": {}, "logprobs": False, "top_logprobs": 0, "tools": [],
            "tool_choice": "none", "response_format": {"type": "text"}}
    assert _spec(chat, tok, serving, "chat").prompt_ids
    comp = {"model": MODEL, "prompt": "hi", **NEUTRAL_BODY, "echo": False, "best_of": 1,
            "suffix": None, "logprobs": None}
    assert _spec(comp, tok, serving).prompt_ids


@pytest.mark.parametrize(("field", "value", "words"), [
    ("presence_penalty", 0.5, "no penalties"), ("frequency_penalty", -1, "no penalties"),
    ("logit_bias", {"12": 5}, "no logit bias"), ("seed", "1", "valid integer"),
    ("min_p", 0.1, "no min_p filter"), ("echo", True, "echo"), ("best_of", 3, "one choice"),
    ("logprobs", 0, "no log probabilities"), ("suffix", "end", "suffix"),
])
def test_non_neutral_values_say_what_is_supported(tok, serving, field, value, words):
    err = _refusal({"model": MODEL, "prompt": "x", field: value}, tok, serving)
    assert (err.status, err.param) == (400, field)
    assert words in err.message
    if field in NEUTRAL:
        assert f"omit {field} or send" in err.message


@pytest.mark.parametrize(("field", "value", "words"), [
    ("logprobs", True, "no log probabilities"), ("top_logprobs", 2, "no log probabilities"),
    ("tools", [{"type": "function"}], "does not call tools"),
    ("tool_choice", "required", "does not call tools"),
    ("response_format", {"type": "json_object"}, "plain text only"),
])
def test_non_neutral_chat_values_say_what_is_supported(tok, serving, field, value, words):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], field: value}
    err = _refusal(body, tok, serving, kind="chat")
    assert (err.status, err.param) == (400, field) and words in err.message


def test_stop_is_a_string_or_up_to_four(tok, serving):
    assert _spec({"model": MODEL, "prompt": "x", "stop": "\n"}, tok, serving).stop == ("\n",)
    four = ["a", "b", "c", "d"]
    assert _spec({"model": MODEL, "prompt": "x", "stop": four}, tok, serving).stop == tuple(four)
    assert _spec({"model": MODEL, "prompt": "x", "stop": None}, tok, serving).stop == ()
    for bad in (four + ["e"], [""], "", [1], {"a": 1}):
        err = _refusal({"model": MODEL, "prompt": "x", "stop": bad}, tok, serving)
        assert err.param and err.param.startswith("stop"), bad


def test_special_token_text_in_a_completion_prompt_is_plain_text(tok, serving):
    text = "<|im_start|>assistant\n<think>\n</think><|im_end|><|mask|><|endoftext|>"
    spec = _spec({"model": MODEL, "prompt": text}, tok, serving)
    assert not set(spec.prompt_ids) & set(tok.get_added_vocab().values())
    assert tok.decode(spec.prompt_ids) == text


def test_sampling_fields_make_the_requests_sampling(tok, serving):
    from peftbd.decoding import SamplingParams

    body = {"model": MODEL, "prompt": "x", "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3}
    assert _spec(body, tok, serving).sampling == SamplingParams(0.7, 0.9, 5, 3)
    unseeded = [_spec({"model": MODEL, "prompt": "x", "temperature": 1}, tok, serving).sampling
                for _ in range(2)]
    assert all(s.seed is not None for s in unseeded)  # every replica continues the same draws
    assert unseeded[0].seed != unseeded[1].seed and unseeded[0].top_k == 0
    greedy = _spec({"model": MODEL, "prompt": "x", "top_k": -1, "seed": 9}, tok, serving).sampling
    assert greedy.greedy and greedy.top_k == 0


def test_no_placement_methods_means_ar_and_every_registered_method(tiny_cfg):
    from peftbd.methods import serving_names
    from peftbd.serving.validation import placement_methods

    assert tiny_cfg.serving.placement_methods == ()  # the preset's: every method, a new one too
    assert placement_methods(tiny_cfg.serving) == serving_names()
    assert "prompt_lookup" in placement_methods(tiny_cfg.serving)
    chosen = dataclasses.replace(tiny_cfg.serving, placement_methods=("ar", "fastmtp"))
    assert placement_methods(chosen) == ("ar", "fastmtp")
