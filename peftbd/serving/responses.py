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
    spec: GenerationSpec, text: str, finish_reason: str, use: Usage, created: int | None = None
) -> Completion | ChatCompletion:
    """The non-streamed response of a completion or chat completion."""
    common = {"id": spec.request_id, "created": created or int(time.time()), "model": spec.model}
    if spec.kind == "chat":
        choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish_reason)
        return ChatCompletion(choices=[choice], usage=use, **common)
    return Completion(
        choices=[CompletionChoice(text=text, finish_reason=finish_reason)], usage=use, **common
    )


def chunk(
    spec: GenerationSpec, text: str | None, finish_reason: str | None = None,
    role: bool = False, created: int | None = None,
) -> Completion | ChatCompletionChunk:
    """One streamed chunk: a text delta (the first chat chunk also carries the role), or the
    finishing chunk with `finish_reason`."""
    common = {"id": spec.request_id, "created": created or int(time.time()), "model": spec.model}
    if spec.kind == "chat":
        delta = ChatDelta(role="assistant" if role else None, content=text)
        return ChatCompletionChunk(
            choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)], **common
        )
    return Completion(
        choices=[CompletionChoice(text=text or "", finish_reason=finish_reason)], **common
    )


def usage_chunk(spec: GenerationSpec, use: Usage, created: int | None = None) -> Completion | ChatCompletionChunk:
    """The last chunk when `stream_options.include_usage` is set: no choices, only usage."""
    common = {"id": spec.request_id, "created": created or int(time.time()), "model": spec.model}
    if spec.kind == "chat":
        return ChatCompletionChunk(choices=[], usage=use, **common)
    return Completion(choices=[], usage=use, **common)
