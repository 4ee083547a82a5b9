"""Property test of the request path (body -> `parse_body` -> `build_spec`, what the ingress runs
before any model work): thousands of generated bodies, well-formed or not (wrong types, unknown
fields, lone surrogates, huge numbers, deep nesting, broken JSON, random bytes), and every one is
either a spec or a `RequestError` with a 4xx OpenAI error body; nothing else ever escapes."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peftbd.serving.schemas import ChatCompletionRequest, CompletionRequest
from peftbd.serving.validation import GenerationSpec, RequestError, build_spec, parse_body

MODEL = "peftbd-tiny"
FIELDS = sorted(set(ChatCompletionRequest.model_fields) | set(CompletionRequest.model_fields))

# any text, lone surrogates and special-token strings included
text = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=20),
    st.sampled_from(["<|im_start|>", "<|im_end|>", "<|mask|>", "<think>", "\ud800", "", " "]),
)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=False), text)
anything = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(text, inner, max_size=3)), max_leaves=6)
role = st.one_of(st.sampled_from(["system", "user", "assistant", "tool"]), anything)
content = st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text})),
                    anything)
message = st.one_of(st.fixed_dictionaries({"role": role, "content": content}), anything)
per_field = {
    "model": st.one_of(st.sampled_from([MODEL, f"{MODEL}:ar", f"{MODEL}:fastmtp",
                                     f"{MODEL}:peftbd_head", "gpt-4o"]), text),
    "messages": st.one_of(st.lists(message, max_size=4), anything),
    "prompt": st.one_of(text, st.lists(st.integers(-5, 10**6), max_size=8),
                        st.lists(st.lists(st.integers(0, 500), max_size=4), max_size=2), anything),
    "stop": st.one_of(text, st.lists(text, max_size=6), anything),
    "max_tokens": st.one_of(st.integers(-3, 10**4), anything),
    "stream": st.one_of(st.booleans(), anything),
}
field_value = {name: per_field.get(name, scalars) for name in FIELDS if name != "model"}
common = {"stop": st.one_of(st.none(), text, st.lists(text, max_size=4)),
          "max_tokens": st.integers(1, 200), "stream": st.booleans(),
          "presence_penalty": st.sampled_from([0, 0.0, 0.5]), "seed": st.integers()}
valid = {
    "chat": {"messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": text}),
        min_size=1, max_size=3)},
    "completions": {"prompt": st.one_of(text, st.lists(st.integers(0, 2000), min_size=1,
                                                       max_size=8))},
}


def near_valid(kind: str) -> st.SearchStrategy:
    """(kind, a body of valid fields for `kind`, one field maybe replaced by anything)."""
    base = st.fixed_dictionaries(
        {"model": st.sampled_from([MODEL, f"{MODEL}:peftbd"]), **valid[kind]}, optional=common)
    return st.builds(lambda b, name, value, mutate: (kind, {**b, name: value} if mutate else b),
                     base, st.sampled_from(FIELDS), st.one_of(scalars, anything), st.booleans())


kinds = st.sampled_from(["chat", "completions"])
requests = st.one_of(
    near_valid("chat"), near_valid("completions"),
    st.tuples(kinds, st.fixed_dictionaries(
        {"model": per_field["model"]}, optional={**field_value, "extra": anything, "pad": text})),
    st.tuples(kinds, anything),
)


def _raw(draw_body: object, mangle: int) -> bytes:
    raw = json.dumps(draw_body).encode()
    if mangle == 1:
        return raw[: len(raw) // 2]  # cut off mid-value
    if mangle == 2:
        return b"[" * 5000 + raw  # deep nesting
    return raw


@pytest.fixture(scope="module")
def setup(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    return load_tokenizer(tiny_cfg), tiny_cfg.serving


def _check(raw: bytes, kind: str, tok, serving) -> None:
    try:
        spec = build_spec(parse_body(raw, kind, serving), kind, tok, serving, request_id="x")
    except RequestError as err:
        assert 400 <= err.status < 500, err.message
        json.dumps(err.body())  # the error body itself serializes
        return
    assert isinstance(spec, GenerationSpec) and spec.prompt_ids


@settings(max_examples=1000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(request=requests, mangle=st.sampled_from([0, 0, 0, 0, 1, 2]))
def test_no_body_gets_past_validation_as_anything_but_a_spec_or_a_4xx(setup, request, mangle):
    kind, body = request
    _check(_raw(body, mangle), kind, *setup)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200), kind=kinds)
def test_random_bytes_are_a_4xx(setup, raw, kind):
    _check(raw, kind, *setup)
