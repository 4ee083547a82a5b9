"""The proxy middleware without a cluster: fake ASGI apps play the Serve proxy whose Ingress
replica died (nothing sent, its own text/plain 500, a stream cut short); the client always gets
an OpenAI error it raises, and finished responses pass through untouched."""

from __future__ import annotations

import asyncio
import json

from serve_apps.proxy_errors import CompleteOpenAIErrors, middlewares

SSE = [(b"content-type", b"text/event-stream")]


def _run(app) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(CompleteOpenAIErrors(app)({"type": "http"}, receive, send))
    return sent


def _error_of(sent: list[dict]) -> tuple[int, dict]:
    start, body = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    assert dict(start["headers"])[b"content-type"] == b"application/json"
    assert sent[-1]["more_body"] is False
    return start["status"], json.loads(body)["error"]


def test_nothing_sent_becomes_a_503_openai_error():
    async def app(scope, receive, send):
        raise RuntimeError("replica died")

    status, error = _error_of(_run(app))
    assert status == 503 and error["type"] == "server_error" and "incomplete" in error["message"]


def test_the_proxys_text_500_becomes_an_openai_error_body():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 500,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
        await send({"type": "http.response.body", "body": b"Internal Server Error"})

    status, error = _error_of(_run(app))
    assert status == 500 and "Internal Server Error" in error["message"]


def test_a_cut_stream_ends_with_an_sse_error_event():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": SSE})
        await send({"type": "http.response.body", "body": b'data: {"x": 1}\n\n', "more_body": True})

    sent = _run(app)
    assert [m["type"] for m in sent] == ["http.response.start"] + ["http.response.body"] * 2
    events = sent[-1]["body"].decode().split("\n\n")
    assert json.loads(events[0].removeprefix("data: "))["error"]["type"] == "server_error"
    assert events[1] == "data: [DONE]" and sent[-1]["more_body"] is False


def test_finished_responses_pass_through_unchanged():
    messages = [
        {"type": "http.response.start", "status": 503,
         "headers": [(b"content-type", b"application/json")]},
        {"type": "http.response.body", "body": b'{"error": {}}', "more_body": False},
    ]

    async def app(scope, receive, send):
        for m in messages:
            await send(m)

    assert _run(app) == messages
    assert [m.cls for m in middlewares()] == [CompleteOpenAIErrors]
