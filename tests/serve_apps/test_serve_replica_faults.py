"""The Serve apps over HTTP when clients or replicas fail (deployed by the `served` fixture,
loopback only; run after the other Serve tests, since they kill replicas): disconnected clients
are released at once, a killed Drafter replica or Verifier mid-request resumes exactly, a
killed Ingress replica fails only its own requests, as openai errors."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests

from peftbd.serving.messages import ReplicaStats

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LONG_PROMPT = (  # the tiny verifier does not stop on its own here: many rounds
    "Summarize in one sentence: In plain English: Both types of literals can be enclosed in "
    "matching single quotes (\"'\") or double quotes (\"\"\"). They can also be enclosed in "
    "matching groups of three single or double quotes (these are generally referred to as "
    "*triple-quoted strings*)."
)
LONG_TOKENS = 128  # the tiny preset's cap: many rounds, so the kill lands mid-request
SHORT_PROMPT, SHORT_TOKENS = "Describe the for statement.", 16


def _serve_logs(served) -> dict[Path, int]:
    return {p: p.stat().st_size for p in Path(served.temp).glob("session_latest/logs/serve/*.log")}


PROBE = """
import json, sys
import ray
from ray import serve
ray.init(address=sys.argv[1], log_to_driver=False)
out = {}
for app, name, count in (("split", "Drafter", 2), ("split", "Verifier", 1), ("colocated", "Engine", 1)):
    handle, seen = serve.get_deployment_handle(name, app), {}
    for i in range(60):  # vary the session id until the consistent-hash router reached each
        stats = handle.options(session_id=f"probe-{i}").stats.remote().result()  # ReplicaStats
        seen[stats.replica] = stats.to_dict()
        if len(seen) == count:
            break
    out[name] = list(seen.values())
print(json.dumps(out))
"""


def _replica_stats(served) -> dict[str, list[ReplicaStats]]:
    """`stats()` of every model replica, from a driver on the test cluster (its own process:
    Ray reads the auth mode once per process)."""
    done = subprocess.run([sys.executable, "-c", PROBE, served.gcs], env=served.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: [ReplicaStats.from_dict(s) for s in stats] for name, stats in out.items()}


def test_disconnected_clients_are_released_at_once_without_a_traceback(served):
    before = _serve_logs(served)
    for app in ("split", "colocated"):
        for method in ("fastmtp", "peftbd", "ar", "peftbd_head"):
            body = {"model": f"{served.model}:{method}", "max_tokens": LONG_TOKENS, "stream": True,
                    "messages": [{"role": "user", "content": LONG_PROMPT}]}
            with requests.post(served.urls[app] + "/chat/completions", json=body, stream=True,
                               timeout=120) as resp:
                lines = resp.iter_lines()
                assert [next(lines) for _ in range(4)]  # a few chunks, then hang up
                resp.raw.connection.sock.shutdown(socket.SHUT_RDWR)
    time.sleep(5)
    stats = _replica_stats(served)
    assert [s.sessions for name in ("Drafter", "Verifier") for s in stats[name]] == [0, 0, 0]
    assert [s.streams for s in stats["Engine"]] == [0]
    new = ""
    for path, size in _serve_logs(served).items():
        with open(path, errors="replace") as f:
            f.seek(before.get(path, 0))
            new += f.read()
    for word in ("Traceback", "CancelledError"):
        at = new.find(word)
        assert at < 0, new[max(at - 2000, 0):at + 3000]
    assert "client disconnected" in new


def _killed_mid_stream(served, method: str, pids: list[int]) -> tuple[str, list]:
    """Stream LONG_PROMPT from the split app, SIGKILL `pids` (replica processes of this test's
    own cluster) after three chunks, read the rest: (the whole text, the chunks after the kill)."""
    stream = served.client("split").chat.completions.create(
        model=f"{served.model}:{method}", messages=[{"role": "user", "content": LONG_PROMPT}],
        max_tokens=LONG_TOKENS, stream=True, stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    chunks = iter(stream)
    for chunk in chunks:
        pieces.append(chunk.choices[0].delta.content or "")
        if len(pieces) == 3:
            break
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    rest = list(chunks)
    return "".join(pieces + [c.choices[0].delta.content or "" for c in rest if c.choices]), rest


def test_killed_drafter_replica_mid_request_recovers(served, engine):
    """Kill every Drafter replica process while a streamed request is mid-way: the request
    resumes on a new replica from its committed tokens and the answer is still the engine's."""
    _, greedy = engine
    pids = served.replica_pids("split", "Drafter")  # looked up first: the CLI takes seconds
    assert len(pids) == 2
    text, rest = _killed_mid_stream(served, "fastmtp", pids)
    assert text == greedy(LONG_PROMPT, LONG_TOKENS)
    assert rest[-1].usage.model_extra["speculative"]["resumes"] >= 1


def test_killed_verifier_mid_request_recovers(served, engine):
    """Kill the split app's Verifier (one replica: it runs every request's rounds) while a
    streamed request is mid-way: the Ingress resumes the request on its replacement from the
    tokens already sent, and the answer is still the engine's."""
    _, greedy = engine
    [pid] = served.replica_pids("split", "Verifier")
    text, rest = _killed_mid_stream(served, "peftbd", [pid])
    assert text == greedy(LONG_PROMPT, LONG_TOKENS)
    assert rest[-1].usage.model_extra["speculative"]["resumes"] >= 1
    assert served.replica_pids("split", "Verifier") != [pid]


def test_killed_ingress_fails_only_its_own_requests_as_openai_errors(served, engine):
    """SIGKILL one of the two split Ingress replicas under 8 in-flight requests (streamed and
    not): each either completes exactly or raises an openai error (the proxy middleware's error
    body or SSE error event), never a 200 that looks complete; a new request succeeds at once."""
    _, greedy = engine
    pids = served.replica_pids("split", "Ingress")
    assert len(pids) == 2
    client = served.client("split")
    started = threading.Semaphore(0)
    expected = greedy(LONG_PROMPT, LONG_TOKENS)
    messages = [{"role": "user", "content": LONG_PROMPT}]

    def one(i: int) -> tuple[str, str]:
        try:
            if i % 2:
                started.release()
                resp = client.chat.completions.create(model=f"{served.model}:ar", messages=messages,
                                                      max_tokens=LONG_TOKENS)
                return "ok", resp.choices[0].message.content
            text = ""
            for n, c in enumerate(client.chat.completions.create(
                    model=f"{served.model}:ar", messages=messages, max_tokens=LONG_TOKENS, stream=True)):
                if n == 1:
                    started.release()
                text += (c.choices[0].delta.content or "") if c.choices else ""
            return "ok", text
        except openai.APIStatusError as exc:
            assert exc.status_code >= 500 and exc.body["type"] == "server_error", exc.body
            return "error", exc.body["message"]
        except openai.APIError as exc:  # the SSE error event
            assert exc.body and exc.body["type"] == "server_error", exc.body
            return "error", exc.message

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(one, i) for i in range(8)]
        for _ in range(8):
            assert started.acquire(timeout=300)
        os.kill(pids[0], signal.SIGKILL)  # a replica process of this test's own cluster
        results = [f.result() for f in futures]
    assert all(text == expected for kind, text in results if kind == "ok"), results
    assert any(kind == "error" for kind, _ in results), "no request was on the killed replica"
    assert served.chat("split", SHORT_PROMPT, "ar", SHORT_TOKENS).choices[0].message.content == greedy(
        SHORT_PROMPT, SHORT_TOKENS)
