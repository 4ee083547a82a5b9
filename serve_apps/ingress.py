"""The OpenAI-compatible HTTP ingress shared by both apps (FastAPI via `@serve.ingress`).

    GET  /v1/models             the served model and one id per method (<name>:<method>)
    POST /v1/completions        prompt (text or token ids) -> text; `stream: true` = SSE
    POST /v1/chat/completions   messages (chat template, thinking off) -> assistant message

It validates and tokenizes (`peftbd.serving.validation`), gets the request's steps from its
backend (colocated `Engine`, or the split app's `Verifier`, which drafts through the
`Drafter`), detokenizes incrementally and reports usage with speculative stats; per-round
metrics go to Prometheus.
"""
# No `from __future__ import annotations` here: FastAPI reads the route signatures at runtime.

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from ray import serve
from ray.exceptions import TaskCancelledError
from ray.serve.exceptions import RequestCancelledError
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
from peftbd.serving.outcome import RequestOutcome
from peftbd.serving.roles import Role
from peftbd.serving.synthetic import check_sampled, method_label, synthetic_rates
from peftbd.serving.validation import (
    GenerationSpec,
    Kind,
    RequestError,
    build_spec,
    check_body_size,
    parse_body,
    read_body,
)
from serve_apps.args import AppArgs
from serve_apps.backends import BackendUnavailable, StreamBackend
from serve_apps.metrics import RoundMetrics

log = logging.getLogger("ray.serve")
CLIENT_GONE = (RequestCancelledError, TaskCancelledError)
"""What a downstream call raises once Serve cancelled the request (its client disconnected)."""
api = FastAPI(title="peftbd: speculative decoding, OpenAI-compatible")


def _error(err: RequestError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _gone(spec: GenerationSpec) -> None:
    log.info("%s: client disconnected; request abandoned, its sessions released", spec.request_id)


def _server_error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


@api.exception_handler(Exception)
async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    """A bug, not the client's fault: still an OpenAI error body (500); Serve logs the traceback."""
    return JSONResponse(_server_error(f"internal error ({type(exc).__name__}); the request "
                                      "was not completed"), status_code=500)


class _QuietDisconnect:
    """ASGI middleware: once Serve cancelled a request (its client left), reading the request
    raises Ray's cancellation errors; they mean `http.disconnect`, and the request ends with one
    info line instead of a 500 and a traceback."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def receive_or_disconnect() -> Message:
            try:
                return await receive()
            except CLIENT_GONE:
                return {"type": "http.disconnect"}

        try:
            await self.app(scope, receive_or_disconnect, send)
        except (*CLIENT_GONE, ClientDisconnect):
            log.info("%s: client disconnected", scope.get("path"))


api.add_middleware(_QuietDisconnect)


@serve.deployment(name=Role.INGRESS.deployment, max_ongoing_requests=256)
@serve.ingress(api)
class Ingress:
    """Front end of the `colocated` app (given `engine`) or the `split` app (given its
    `verifier`)."""

    def __init__(self, args: dict[str, Any], engine: DeploymentHandle | None = None,
                 verifier: DeploymentHandle | None = None) -> None:
        self.cfg = AppArgs.model_validate(args).load()
        self.serving = self.cfg.serving
        self.tokenizer = load_tokenizer(self.cfg)
        if engine is not None and verifier is None:
            self.placement, self.backend = "colocated", StreamBackend(engine, self.serving, Role.ENGINE)
        elif verifier is not None and engine is None:
            self.placement = "split"
            self.backend = StreamBackend(verifier, self.serving, Role.VERIFIER)
        else:
            raise ValueError("the Ingress takes an `engine` (colocated) or a `verifier` (split)")
        self.metrics = RoundMetrics(self.placement)
        self.synthetic = synthetic_rates(self.cfg)  # {method: tokens per round} of the synthetic
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
            body = await read_body(request.stream(), self.serving)
            req = parse_body(body, kind, self.serving)
            spec = build_spec(req, kind, self.tokenizer, self.serving,
                              request_id=f"{prefix}-{uuid.uuid4().hex}")
            check_sampled(spec, self.synthetic)
        except RequestError as err:
            return _error(err)
        if spec.stream:
            return StreamingResponse(self._sse(spec), media_type="text/event-stream")
        outcome = RequestOutcome(self.tokenizer, spec.method, spec.stop,
                                 self.synthetic.get(spec.method), spec.sampling.temperature)
        try:
            text = "".join([piece async for piece in self._text(spec, outcome)])
        except BackendUnavailable as exc:
            return JSONResponse(_server_error(str(exc)), status_code=503)
        except CLIENT_GONE:
            _gone(spec)
            return JSONResponse(_server_error("client disconnected"), status_code=499)
        except asyncio.CancelledError:
            _gone(spec)
            raise
        use = usage(spec, outcome.completion_tokens, outcome.stats.summary())
        return JSONResponse(full_response(spec, text, outcome.finish_reason, use).model_dump())

    async def _text(self, spec: GenerationSpec, outcome: RequestOutcome
                    ) -> AsyncGenerator[str, None]:
        """Text deltas of one request as its steps arrive, up to a stop sequence; fills
        `outcome` (usage and metrics count what the client received). Leaving early (stop
        sequence, client gone) closes the backend's rounds at once, which releases the
        request's sessions."""
        async with contextlib.aclosing(self.backend.rounds(spec)) as rounds:
            async for event in rounds:
                delta, received = outcome.push(event)
                self.metrics.observe(received, method_label(spec.method, self.synthetic),
                                     spec.sampling.temperature)
                if delta:
                    yield delta
                if outcome.stopped:
                    return
        rest = outcome.finish()
        if rest:
            yield rest

    async def _sse(self, spec: GenerationSpec) -> AsyncIterator[str]:
        """The SSE events of one request; a failure after some text is an error event that
        says the text is incomplete; a client that left ends it quietly."""
        outcome = RequestOutcome(self.tokenizer, spec.method, spec.stop,
                                 self.synthetic.get(spec.method), spec.sampling.temperature)
        first = True
        try:
            async with contextlib.aclosing(self._text(spec, outcome)) as deltas:
                async for delta in deltas:
                    yield sse(chunk(spec, delta, role=first))
                    first = False
        except BackendUnavailable as exc:
            sent = f" after {outcome.completion_tokens} tokens, so the text streamed is " \
                   "incomplete" if outcome.completion_tokens else ""
            yield sse(_server_error(f"{exc}; the answer stopped{sent}"))
            yield SSE_DONE
            return
        except CLIENT_GONE:  # nobody to tell: end quietly (the sessions are released)
            _gone(spec)
            return
        except asyncio.CancelledError:
            _gone(spec)
            raise
        yield sse(chunk(spec, "" if spec.kind == "completions" else None,
                        finish_reason=outcome.finish_reason, role=first))
        if spec.include_usage:
            use = usage(spec, outcome.completion_tokens, outcome.stats.summary())
            yield sse(usage_chunk(spec, use))
        yield SSE_DONE
