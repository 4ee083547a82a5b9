"""Request validation without Ray: every refusal names its field; accepted requests become specs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from peftbd.config import ConfigError, load_config
from peftbd.data.chat import encode_prompt
from peftbd.serving.validation import (
    RequestError,
    build_spec,
    check_serving_config,
    parse_body,
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
        ({"model": MODEL, "prompt": "x", "logprobs": 2}, "logprobs", "unknown field"),
        ({"prompt": "x"}, "model", "required"),
        ({"model": MODEL, "prompt": [1, "a"]}, "prompt", "list of token ids"),
        ({"model": MODEL, "prompt": ""}, "prompt", "empty"),
        ({"model": MODEL, "prompt": [10**7]}, "prompt", "ids in [0,"),
        ({"model": MODEL, "prompt": "x", "method": "medusa"}, "method", "'peft-bd'"),
        ({"model": MODEL, "prompt": "x", "temperature": 0.7}, "temperature", "greedily only"),
        ({"model": MODEL, "prompt": "x", "top_p": 0.9}, "top_p", "greedily only"),
        ({"model": MODEL, "prompt": "x", "n": 2}, "n", "one answer"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 10_000}, "max_tokens", "serving.max_tokens_cap"),
        ({"model": MODEL, "prompt": "word " * 400}, "prompt", "serving.max_prompt_tokens"),
        ({"model": f"{MODEL}:ar", "prompt": "x", "method": "fastmtp"}, "method", "contradicts"),
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


def test_method_from_model_suffix_or_field(serving):
    assert resolve_method(MODEL, None, MODEL, "peft-bd") == "peft-bd"
    assert resolve_method(f"{MODEL}:fastmtp", None, MODEL, "peft-bd") == "fastmtp"
    assert resolve_method(MODEL, "ar", MODEL, "peft-bd") == "ar"
    assert resolve_method(f"{MODEL}:ar", "ar", MODEL, "peft-bd") == "ar"


def test_serving_config_is_checked_at_startup(serving):
    check_serving_config(serving)
    bad = dataclasses.replace(serving, default_method="greedy")  # load_config would refuse it
    with pytest.raises(ConfigError, match="serving.default_method"):
        check_serving_config(bad)
