"""The OpenAI-compatible HTTP ingress shared by both apps (FastAPI via `@serve.ingress`).

    GET  /v1/models             the served model and one id per method (<name>:<method>)
    POST /v1/completions        prompt (text or token ids) -> text; `stream: true` = SSE
    POST /v1/chat/completions   messages (chat template, thinking off) -> assistant message

It validates and tokenizes (`peftbd.serving.validation`), gets the request's steps from its
backend (colocated `Engine`, or split `Drafter` + `Verifier`), detokenizes incrementally and
reports usage with speculative stats; per-round metrics go to Prometheus.
"""
# No `from __future__ import annotations` here: FastAPI reads the route signatures at runtime.

import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve
from ray.serve.handle import DeploymentHandle

from peftbd.models.loading import load_tokenizer
from peftbd.serving.responses import (
    SSE_DONE,
    chunk,
    full_response,
    model_list,
    sse,
    usage,
    usage_chunk,
)
from peftbd.serving.rounds import RequestStats
from peftbd.serving.text_stream import TextStream
from peftbd.serving.validation import (
    GenerationSpec,
    Kind,
    RequestError,
    build_spec,
    check_body_size,
    parse_body,
)
from serve_apps.args import AppArgs
from serve_apps.backends import BackendUnavailable, ColocatedBackend, SplitBackend
from serve_apps.metrics import RoundMetrics

log = logging.getLogger("ray.serve")
api = FastAPI(title="peftbd: speculative decoding, OpenAI-compatible")


class _Outcome:
    """Filled in while a request streams: its stats, finish reason and completion tokens."""

    def __init__(self, method: str) -> None:
        self.stats = RequestStats(method)
        self.finish_reason = "length"
        self.completion_tokens = 0


def _error(err: RequestError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _server_error(exc: Exception) -> dict[str, Any]:
    return {"error": {"message": str(exc), "type": "server_error", "param": None, "code": None}}


@serve.deployment(name="Ingress", max_ongoing_requests=256)
@serve.ingress(api)
class Ingress:
    """Front end of the `colocated` app (given `engine`) or the `split` app (given `drafter` and
    `verifier`)."""

    def __init__(self, args: dict[str, Any], engine: DeploymentHandle | None = None,
                 drafter: DeploymentHandle | None = None,
                 verifier: DeploymentHandle | None = None) -> None:
        self.cfg = AppArgs.model_validate(args).load()
        self.serving = self.cfg.serving
        self.tokenizer = load_tokenizer(self.cfg)
        if engine is not None:
            self.placement, self.backend = "colocated", ColocatedBackend(engine, self.serving)
        else:
            self.placement = "split"
            self.backend = SplitBackend(drafter, verifier, self.serving)
        self.metrics = RoundMetrics(self.placement)
        self.created = int(time.time())

    @api.get("/v1/models")
    def models(self) -> dict[str, Any]:
        return model_list(self.serving.model_name, self.created).model_dump()

    @api.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self._serve(request, "completions")

    @api.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self._serve(request, "chat")

    async def _serve(self, request: Request, kind: Kind) -> Response:
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        try:
            declared = request.headers.get("content-length", "")
            check_body_size(int(declared) if declared.isdigit() else 0, self.serving)
            req = parse_body(await request.body(), kind, self.serving)
            spec = build_spec(req, kind, self.tokenizer, self.serving,
                              request_id=f"{prefix}-{uuid.uuid4().hex}")
        except RequestError as err:
            return _error(err)
        if spec.stream:
            return StreamingResponse(self._sse(spec), media_type="text/event-stream")
        outcome = _Outcome(spec.method)
        try:
            text = "".join([piece async for piece in self._text(spec, outcome)])
        except BackendUnavailable as exc:
            return JSONResponse(_server_error(exc), status_code=503)
        use = usage(spec, outcome.completion_tokens, outcome.stats.summary())
        return JSONResponse(full_response(spec, text, outcome.finish_reason, use).model_dump())

    async def _text(self, spec: GenerationSpec, outcome: _Outcome) -> AsyncIterator[str]:
        """Text deltas of one request as its steps arrive; fills `outcome`."""
        stream = TextStream(self.tokenizer)
        async for event in self.backend.rounds(spec):
            outcome.stats.add(event)
            self.metrics.observe(event, spec.method)
            outcome.completion_tokens += len(event.tokens)
            if event.finish_reason:
                outcome.finish_reason = event.finish_reason
            delta = stream.push(event.tokens)
            if delta:
                yield delta
        rest = stream.finish()
        if rest:
            yield rest

    async def _sse(self, spec: GenerationSpec) -> AsyncIterator[str]:
        outcome = _Outcome(spec.method)
        first = True
        try:
            async for delta in self._text(spec, outcome):
                yield sse(chunk(spec, delta, role=first))
                first = False
        except BackendUnavailable as exc:
            yield sse(_server_error(exc))
            yield SSE_DONE
            return
        yield sse(chunk(spec, "" if spec.kind == "completions" else None,
                        finish_reason=outcome.finish_reason, role=first))
        if spec.include_usage:
            use = usage(spec, outcome.completion_tokens, outcome.stats.summary())
            yield sse(usage_chunk(spec, use))
        yield SSE_DONE
