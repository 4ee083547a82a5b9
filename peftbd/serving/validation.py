"""Turn an HTTP body into a `GenerationSpec`, or a `RequestError` that names the field.

Policy on top of the schemas: body size (refused as soon as the cap is crossed), JSON, text that
UTF-8 can carry, types (via `peftbd.serving.schemas`), sampling (`temperature`, `top_p`, `top_k`,
`seed`: lossless speculative sampling; a sampled request without a seed gets one here, so every
replica that resumes it continues the same draws), penalty, logprob and tool fields accepted only
at their neutral values, one choice per request, stop sequences, the
`max_tokens` cap, the prompt-length limit and the method choice (model name suffix
`<served>:<method>` or the extra `method` field). User text is tokenized as plain text: no
special token can be written into a prompt as text (`peftbd.data.chat`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from transformers import PreTrainedTokenizerBase

from peftbd.config import ConfigError, ServingConfig
from peftbd.data.chat import encode_plain, encode_prompt
from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.method_catalog import rename_hint
from peftbd.methods import serving_names
from peftbd.serving.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorDetail,
    ErrorResponse,
)

Kind = Literal["completions", "chat"]
GenerationRequest = CompletionRequest | ChatCompletionRequest
"""A parsed request body of either endpoint."""
_SCHEMAS: dict[str, type[CompletionRequest] | type[ChatCompletionRequest]] = {
    "completions": CompletionRequest, "chat": ChatCompletionRequest,
}


class RequestError(Exception):
    """A request the server refuses: HTTP `status`, the offending `param` and how to fix it."""

    def __init__(
        self, message: str, param: str | None = None, status: int = 400,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type = message, param, status, type

    def body(self) -> dict[str, Any]:
        """The OpenAI error body (`{"error": {"message", "type", "param", "code"}}`)."""
        return ErrorResponse(
            error=ErrorDetail(message=self.message, type=self.type, param=self.param)
        ).model_dump()


@dataclass(frozen=True)
class GenerationSpec:
    """One validated request, as plain data the decoders get (picklable, no tensors)."""

    request_id: str
    kind: Kind
    model: str
    method: str
    prompt_ids: list[int]
    max_new_tokens: int
    stream: bool
    include_usage: bool
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = GREEDY


def check_serving_config(serving: ServingConfig) -> None:
    """Fail at startup (not per request) on a serving config the apps cannot honour: among
    others, a method name no registered method serves (`peftbd.methods.serving_names`)."""
    for key, names in (("default_method", (serving.default_method,)),
                       ("placement_methods", serving.placement_methods)):
        unknown = [n for n in names if n not in serving_names()]
        if unknown:
            raise ConfigError(f"config key 'serving.{key}': {unknown[0]!r} is not one of "
                              f"{list(serving_names())}{rename_hint(unknown[0])}")
    if ":" in serving.model_name or not serving.model_name:
        raise ConfigError(
            f"config key 'serving.model_name': {serving.model_name!r} must be non-empty and "
            "contain no ':' (the method suffix separator)"
        )


def placement_methods(serving: ServingConfig) -> tuple[str, ...]:
    """What `jobs.placement` measures: `serving.placement_methods`, or when empty greedy AR and
    every registered method (a new one, a plugin's too, with no edit)."""
    return tuple(serving.placement_methods) or serving_names()


def served_model_ids(served_name: str) -> list[str]:
    """The ids `GET /v1/models` lists: the served name (default method) and `<name>:<method>`."""
    return [served_name] + [f"{served_name}:{m}" for m in serving_names()]


def check_body_size(nbytes: int, serving: ServingConfig) -> None:
    """413 for a body (declared or read) over `serving.max_body_bytes`."""
    if nbytes > serving.max_body_bytes:
        raise RequestError(
            f"request body is {nbytes} bytes; this server accepts at most "
            f"{serving.max_body_bytes} (serving.max_body_bytes)", status=413,
        )


async def read_body(chunks: AsyncIterable[bytes], serving: ServingConfig) -> bytes:
    """The body from its chunks; 413 as soon as they add up to more than the cap (the rest is
    never read)."""
    body = bytearray()
    async for piece in chunks:
        body += piece
        check_body_size(len(body), serving)
    return bytes(body)


def parse_body(body: bytes, kind: Kind, serving: ServingConfig) -> GenerationRequest:
    """Size check, JSON decode and schema validation of a request body."""
    check_body_size(len(body), serving)
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RequestError(f"request body must be a JSON object, got {type(data).__name__}")
    _check_text(data)
    schema = _SCHEMAS[kind]
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise _field_error(exc, schema) from exc


def _check_text(data: dict[str, Any]) -> None:
    """400 naming the first string (key or value) UTF-8 cannot encode: a lone surrogate such as
    `"\\ud800"` is valid JSON but no text. Iterative: nesting depth costs no stack."""
    todo: list[tuple[str, Any]] = [("", data)]
    while todo:
        path, value = todo.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                if not _utf8(key):
                    raise RequestError(f"a field name in {path or 'the body'} is not valid "
                                       "Unicode text (a lone surrogate)", param=path or None)
                todo.append((f"{path}.{key}" if path else key, item))
        elif isinstance(value, list):
            todo += [(f"{path}[{i}]", item) for i, item in enumerate(value)]
        elif isinstance(value, str) and not _utf8(value):
            raise RequestError(f"{path} is not valid Unicode text: it holds a lone surrogate (an "
                               "unpaired \\ud800-\\udfff escape); send UTF-8 text", param=path)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _field_error(exc: ValidationError, schema: type[BaseModel]) -> RequestError:
    err = exc.errors(include_url=False)[0]
    param = _param_name(err["loc"])
    if err["type"] == "extra_forbidden":
        return RequestError(
            f"unknown field {param!r}; this endpoint accepts: {', '.join(schema.model_fields)}",
            param=param,
        )
    if err["type"] == "missing":
        return RequestError(f"{param} is required", param=param)
    msg = err["msg"].removeprefix("Value error, ")
    got = repr(err.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    return RequestError(f"{param}: {msg} (got {got})", param=param)


def _param_name(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'content') -> 'messages[0].content'; drops pydantic's union-branch tags."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
    return out or "body"


def resolve_method(model: str, method: str | None, served_name: str, default: str) -> str:
    """The decoding method from the model id (`<served>` or `<served>:<method>`) and `method`."""
    if model not in served_model_ids(served_name):
        raise RequestError(
            f"model {model!r} is not served here{rename_hint(model.partition(':')[2])}; use one "
            f"of {served_model_ids(served_name)} (GET /v1/models lists them)",
            param="model", status=404, type="not_found_error",
        )
    from_model = model.partition(":")[2] or None
    if from_model and method and from_model != method:
        raise RequestError(
            f"method={method!r} contradicts model={model!r}; give the method once (either the "
            f"model suffix or the method field)", param="method",
        )
    return from_model or method or default


_EXACT = ("this server's output is distributed exactly as the verifier's own (greedy, or "
          "sampled with temperature / top_p / top_k)")
_ONE = ("one choice per request; send n separate requests (with different seeds when sampling, "
        "or none: each then gets its own)")
NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "min_p": ((0.0,), f"{_EXACT}, with no min_p filter"),
    "n": ((1,), _ONE),
    "best_of": ((1,), _ONE),
    "presence_penalty": ((0.0,), f"{_EXACT}, with no penalties"),
    "frequency_penalty": ((0.0,), f"{_EXACT}, with no penalties"),
    "repetition_penalty": ((1.0,), f"{_EXACT}, with no penalties"),
    "logit_bias": (({},), f"{_EXACT}, with no logit bias"),
    "logprobs": ((False,), "this server returns no log probabilities"),
    "top_logprobs": ((0,), "this server returns no log probabilities"),
    "echo": ((False,), "this server does not echo the prompt"),
    "suffix": (("",), "this server does not insert text (no suffix)"),
    "response_format": (({"type": "text"},), "this server answers in plain text only"),
    "tools": (([],), "this server does not call tools"),
    "tool_choice": (("none", "auto"), "this server does not call tools"),
}
"""Accepted fields the decoding ignores: omitted, null or one of these values (same type), else
a 400 that says what is supported."""


def _check_neutral(req: BaseModel) -> None:
    for field, (neutral, supported) in NEUTRAL.items():
        value = getattr(req, field, None)
        if value is None or any(type(value) is type(v) and value == v for v in neutral):
            continue
        allowed = " or ".join(json.dumps(v) for v in neutral)
        raise RequestError(
            f"{field}={json.dumps(value)[:80]} is not supported: {supported}; omit {field} or "
            f"send {allowed}", param=field,
        )


def sampling_params(req: GenerationRequest) -> SamplingParams:
    """The request's sampling (omitted / null fields: OpenAI's defaults, which for this server
    mean greedy at temperature 0 or absent; `top_k` -1 or 0: no top-k filter); a sampled request
    without a seed gets a random one."""
    if req.top_k is not None and req.top_k < -1:
        raise RequestError(f"top_k={req.top_k}; use -1 or 0 (no filter) or a positive count",
                           param="top_k")
    try:
        params = SamplingParams(temperature=float(req.temperature or 0.0),
                                top_p=float(1.0 if req.top_p is None else req.top_p),
                                top_k=max(req.top_k or 0, 0), seed=req.seed)
    except ValueError as exc:
        raise RequestError(str(exc), param=str(exc).partition("=")[0]) from exc
    return params.resolved()


def _max_new_tokens(req: GenerationRequest, serving: ServingConfig) -> int:
    param, value = "max_tokens", req.max_tokens
    if isinstance(req, ChatCompletionRequest) and req.max_completion_tokens is not None:
        if value is not None and value != req.max_completion_tokens:
            raise RequestError(
                f"max_tokens={value} and max_completion_tokens={req.max_completion_tokens} "
                "disagree; send one of them", param="max_completion_tokens",
            )
        param, value = "max_completion_tokens", req.max_completion_tokens
    if value is None:
        return serving.max_tokens_cap
    if value > serving.max_tokens_cap:
        raise RequestError(
            f"{param}={value} exceeds this server's cap of {serving.max_tokens_cap} "
            "(serving.max_tokens_cap); send a smaller value", param=param,
        )
    return value


def prompt_ids(req: GenerationRequest, tokenizer: PreTrainedTokenizerBase) -> tuple[list[int], str]:
    """(token ids, field name) of the prompt: chat turns rendered with the template (thinking
    off), a text prompt tokenized as plain text (special-token text included), or token ids
    checked against the vocabulary."""
    if isinstance(req, ChatCompletionRequest):
        messages = [m.model_dump() for m in req.messages]
        if not any(m["role"] == "user" for m in messages):
            raise RequestError("messages must contain at least one user turn", param="messages")
        return encode_prompt(tokenizer, messages), "messages"
    if isinstance(req.prompt, str):
        if not req.prompt:
            raise RequestError("prompt is empty; send some text", param="prompt")
        return encode_plain(tokenizer, req.prompt), "prompt"
    vocab = len(tokenizer)
    bad = [t for t in req.prompt if not 0 <= t < vocab]
    if not req.prompt or bad:
        raise RequestError(
            f"prompt token ids must be a non-empty list of ids in [0, {vocab}); bad: {bad[:5]}",
            param="prompt",
        )
    return list(req.prompt), "prompt"


def build_spec(
    req: GenerationRequest,
    kind: Kind,
    tokenizer: PreTrainedTokenizerBase,
    serving: ServingConfig,
    request_id: str,
) -> GenerationSpec:
    """Apply the serving policy to a parsed request and tokenize its prompt."""
    _check_neutral(req)
    method = resolve_method(req.model, req.method, serving.model_name, serving.default_method)
    max_new = _max_new_tokens(req, serving)
    ids, field = prompt_ids(req, tokenizer)
    if len(ids) > serving.max_prompt_tokens:
        raise RequestError(
            f"{field} is {len(ids)} tokens; this server accepts at most "
            f"{serving.max_prompt_tokens} (serving.max_prompt_tokens); shorten it", param=field,
        )
    return GenerationSpec(
        request_id=request_id, kind=kind, model=req.model, method=method, prompt_ids=ids,
        max_new_tokens=max_new, stream=req.stream,
        include_usage=bool(req.stream_options and req.stream_options.include_usage),
        stop=(req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ()),
        sampling=sampling_params(req),
    )
