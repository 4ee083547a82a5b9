"""OpenAI-compatible request and response bodies (the subset the apps serve), as pydantic models.

Requests are strict (no type coercion: `"max_tokens": "8"` is an error) and closed (an unknown
field is an error that names it). These models check shapes and types only; serving policy
(sampling, limits, the method choice) lives in `peftbd.serving.validation`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from peftbd.methods import serving_names

FinishReason = Literal["stop", "length"]

MAX_STOP = 4
"""Stop sequences a request may give (OpenAI's limit)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    """`stream_options`: `include_usage` adds a last chunk with `usage` (and speculative stats)."""

    include_usage: bool = False


class _GenerationRequest(_Strict):
    """Fields shared by completions and chat completions."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    top_k: int | None = None
    min_p: float | None = None
    method: str | None = None
    """Extra field (not OpenAI's): the decoding method (`peftbd.methods.serving_names`); the model
    name can carry it instead."""

    @field_validator("method")
    @classmethod
    def _served_method(cls, value: str | None) -> str | None:
        if value is not None and value not in serving_names():
            raise ValueError(f"must be one of {', '.join(map(repr, serving_names()))}")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_sequences(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP or not all(stops):
            raise ValueError(f"must be a non-empty string or a list of at most {MAX_STOP} of them")
        return value


class CompletionRequest(_GenerationRequest):
    """`POST /v1/completions`: one prompt, as text or as token ids."""

    prompt: str | list[int]
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    logprobs: int | None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
            value = value[0]  # a batch of one: ["text"] or [[ids]]
        if isinstance(value, str):
            return value
        if isinstance(value, list) and all(type(v) is int for v in value):
            return value
        raise ValueError(
            "must be a string or a list of token ids (one prompt per request; send batches as "
            "separate requests)"
        )


class ChatMessage(_Strict):
    """One chat turn; `content` may be a string or a list of `{"type": "text", "text": ...}` parts."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts(cls, value: Any) -> Any:
        if isinstance(value, list):
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in value
            ):
                raise ValueError('content parts must all be {"type": "text", "text": "..."}')
            return "".join(p["text"] for p in value)
        return value


class ChatCompletionRequest(_GenerationRequest):
    """`POST /v1/chat/completions`: the conversation, rendered with the chat template."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None


class SpecStats(BaseModel):
    """Speculative-decoding stats of one request (inside `usage.speculative`).

    Times are totals in ms measured by the replicas (prefill; draft, verify, state sync and other
    work over the rounds; `queued_ms`: waiting there for admission, for other requests' prefill
    chunks, for its turn in the step loop) and outside them (`transport_ms`: the ingress's wall
    time minus the replica-side time, plus a split Verifier's hops to its Drafter). `tokens_per_round` = tokens emitted by the rounds / rounds;
    `resumes` = times a replica rebuilt this request's state from its committed tokens;
    `feature_bytes` = verifier state sent to a split drafter (the heads' features, FastMTP's
    hidden states, PEFT-BD's KV; the prompt's included), 0 for other methods and colocated;
    `mean_batch_size` = requests per batched step over its rounds, `prefill_batch_size` the
    requests its prefill chunk carried.
    `pre_drafted_rounds`: rounds whose draft was drafted ahead (`serving.draft_ahead`).
    `synthetic`: set when the method runs under controlled acceptance (`serving.synthetic`): the
    tokens per round its drafts were forced to (its acceptance is chosen, not measured; the
    output is still the verifier's greedy output). `temperature`: the request's sampling
    temperature (0: greedy); acceptance under sampling follows the lossless rule.
    """

    method: str
    synthetic: float | None = None
    temperature: float = 0.0
    rounds: int = 0
    pre_drafted_rounds: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    tokens_per_round: float = 0.0
    acceptance_rate: float = 0.0
    prefill_ms: float = 0.0
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    sync_ms: float = 0.0
    other_ms: float = 0.0
    queued_ms: float = 0.0
    transport_ms: float = 0.0
    resumes: int = 0
    feature_bytes: int = 0
    mean_batch_size: float = 0.0
    prefill_batch_size: int = 0


class Usage(BaseModel):
    """OpenAI `usage` plus this server's `speculative` stats."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    speculative: SpecStats | None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: None = None


class Completion(BaseModel):
    """A `text_completion` response, or one streamed chunk of it (then `usage` is usually None)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: FinishReason | None = None
    logprobs: None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "peftbd"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body: the `openai` client raises it as `BadRequestError` & co."""

    error: ErrorDetail
