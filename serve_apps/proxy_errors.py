"""Ray Serve proxy middleware: a response the proxy could not finish still ends as an OpenAI error.

When an Ingress replica dies mid-request, the Serve proxy (not our code) answers: a text/plain
500 if nothing was sent yet, or a stream cut off without an end. This middleware runs in the
proxy and turns the first into an OpenAI error body (503, type `server_error`) and ends the
second with an SSE error event and `data: [DONE]`, so the openai client raises instead of
returning a text that looks complete. Enable it on every node that runs a proxy:

    RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=serve_apps.proxy_errors:middlewares ray start ...
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("ray.serve")
LOST = ("the server replica handling this request was lost before it finished; the answer is "
        "incomplete or missing. Retry the request")


def _error_json(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": None}}).encode()


class CompleteOpenAIErrors:
    """Pure ASGI middleware (streaming-safe): passes every finished response through unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state: dict[str, Any] = {"start": None, "started": False, "done": False, "sse": False}

        async def guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                ctype = headers.get(b"content-type", b"").decode("latin-1")
                state["sse"] = ctype.startswith("text/event-stream")
                if message["status"] >= 500 and not ctype.startswith("application/json"):
                    state["start"] = message  # the proxy's own error: replaced below
                    return
                state["started"] = True
            elif message["type"] == "http.response.body" and state["start"] is not None:
                if not message.get("more_body", False):
                    text = message.get("body", b"").decode("utf-8", "replace").strip()
                    await _send_error(send, state["start"]["status"],
                                      f"the server could not complete this request ({text}); "
                                      "retry it")
                    state["done"] = True
                return
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                state["done"] = True
            await send(message)

        try:
            await self.app(scope, receive, guarded)
        except asyncio.CancelledError:  # the client left: nobody to answer
            raise
        except Exception as exc:  # answered below instead of a cut connection
            log.warning("proxy request failed (%s: %s); answered with an OpenAI error",
                        type(exc).__name__, exc)
        if not state["done"]:
            await _finish(send, state)


async def _finish(send: Send, state: dict[str, Any]) -> None:
    """End a response the app left unfinished: an error body if nothing was sent, an SSE error
    event if a stream was cut, else just the end of the body."""
    if not state["started"]:
        await _send_error(send, 503, LOST)
        return
    body = (b"data: " + _error_json(LOST) + b"\n\ndata: [DONE]\n\n") if state["sse"] else b""
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _send_error(send: Send, status: int, message: str) -> None:
    body = _error_json(message)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def middlewares() -> list[Middleware]:
    """The proxy callback (`RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH`)."""
    return [Middleware(CompleteOpenAIErrors)]
