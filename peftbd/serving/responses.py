"""OpenAI response bodies and server-sent events for one `GenerationSpec`."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import BaseModel

from peftbd.serving.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    Completion,
    CompletionChoice,
    FinishReason,
    ModelCard,
    ModelList,
    SpecStats,
    Usage,
)
from peftbd.serving.validation import GenerationSpec, served_model_ids

SSE_DONE = "data: [DONE]\n\n"
"""The last server-sent event of every stream (OpenAI's convention)."""


def sse(payload: BaseModel | dict[str, Any]) -> str:
    """One server-sent event: `data: <json>` and a blank line."""
    if isinstance(payload, BaseModel):
        payload = payload.model_dump(exclude_none=False)
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def model_list(served_name: str, created: int) -> ModelList:
    """`GET /v1/models`: the served name and one id per method."""
    return ModelList(data=[ModelCard(id=m, created=created) for m in served_model_ids(served_name)])


def usage(spec: GenerationSpec, completion_tokens: int, stats: SpecStats) -> Usage:
    """OpenAI usage of `spec` plus its speculative stats."""
    prompt = len(spec.prompt_ids)
    return Usage(
        prompt_tokens=prompt, completion_tokens=completion_tokens,
        total_tokens=prompt + completion_tokens, speculative=stats,
    )


def full_response(
    spec: GenerationSpec, text: str, finish_reason: FinishReason, use: Usage,
    created: int | None = None,
) -> Completion | ChatCompletion:
    """The non-streamed response of a completion or chat completion."""
    rid, model, stamp = spec.request_id, spec.model, created or int(time.time())
    if spec.kind == "chat":
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish_reason)
        return ChatCompletion(id=rid, created=stamp, model=model, choices=[choice], usage=use)
    return Completion(
        id=rid, created=stamp, model=model, usage=use,
        choices=[CompletionChoice(text=text, finish_reason=finish_reason)],
    )


def chunk(
    spec: GenerationSpec, text: str | None, finish_reason: FinishReason | None = None,
    role: bool = False, created: int | None = None,
) -> Completion | ChatCompletionChunk:
    """One streamed chunk: a text delta (the first chat chunk also carries the role), or the
    finishing chunk with `finish_reason`."""
    rid, model, stamp = spec.request_id, spec.model, created or int(time.time())
    if spec.kind == "chat":
        delta = ChatDelta(role="assistant" if role else None, content=text)
        return ChatCompletionChunk(
            id=rid, created=stamp, model=model,
            choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)],
        )
    return Completion(
        id=rid, created=stamp, model=model,
        choices=[CompletionChoice(text=text or "", finish_reason=finish_reason)],
    )


def usage_chunk(spec: GenerationSpec, use: Usage, created: int | None = None) -> Completion | ChatCompletionChunk:
    """The last chunk when `stream_options.include_usage` is set: no choices, only usage."""
    rid, model, stamp = spec.request_id, spec.model, created or int(time.time())
    if spec.kind == "chat":
        return ChatCompletionChunk(id=rid, created=stamp, model=model, choices=[], usage=use)
    return Completion(id=rid, created=stamp, model=model, choices=[], usage=use)
