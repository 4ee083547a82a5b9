"""Both apps over HTTP (deployed from the YAMLs by the `served` fixture, loopback only), through
the official `openai` client: output equal to the engine's, 8 concurrent requests on two Drafter
replicas, bad requests, metrics under the dashboard's names, killed Drafter replicas."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import requests

from peftbd.serving.schemas import METHODS

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = [
    "Describe the for statement.",
    "Count from 9 to 15.",
    "Explain the Python topic 'dict'.",
    "Describe Never from the typing module.",
]
LONG_PROMPT = (  # the tiny verifier does not stop on its own here: many rounds
    "Summarize in one sentence: In plain English: Both types of literals can be enclosed in "
    "matching single quotes (\"'\") or double quotes (\"\"\"). They can also be enclosed in "
    "matching groups of three single or double quotes (these are generally referred to as "
    "*triple-quoted strings*)."
)

MODEL = "peftbd-tiny"
MAX_TOKENS = 16
LONG_TOKENS = 128  # the tiny preset's cap: many rounds, so the kill lands mid-request
DASHBOARD = Path(__file__).resolve().parents[2] / "serve_apps" / "grafana_dashboard.json"


def _client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)


def _chat(base: str, text: str, method: str, max_tokens: int = MAX_TOKENS):
    return _client(base).chat.completions.create(
        model=f"{MODEL}:{method}", messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
    )


@pytest.mark.parametrize("app", ["colocated", "split"])
def test_both_apps_answer_with_the_engine_output(served, engine, app):
    tok, greedy = engine
    client = _client(served.urls[app])
    assert [m.id for m in client.models.list().data] == [MODEL] + [f"{MODEL}:{m}" for m in METHODS]
    for method in METHODS:
        resp = _chat(served.urls[app], PROMPTS[0], method)
        assert resp.choices[0].message.content == greedy(PROMPTS[0], MAX_TOKENS)
        spec = resp.usage.model_extra["speculative"]
        assert spec["method"] == method and spec["rounds"] >= 1
        assert resp.usage.completion_tokens >= spec["rounds"] + 1  # prefill + >= 1 per round
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=MAX_TOKENS,
        stream=True, stream_options={"include_usage": True}, extra_body={"method": "fastmtp"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy(PROMPTS[1], MAX_TOKENS)
    assert chunks[-1].usage.model_extra["speculative"]["method"] == "fastmtp"
    from peftbd.data.chat import encode_prompt

    ids = encode_prompt(tok, [{"role": "user", "content": PROMPTS[2]}])
    comp = client.completions.create(model=f"{MODEL}:peft-bd", prompt=ids, max_tokens=MAX_TOKENS)
    assert comp.choices[0].text == greedy(PROMPTS[2], MAX_TOKENS)


def test_eight_concurrent_requests_per_app_are_all_correct(served, engine):
    _, greedy = engine
    jobs = [(app, PROMPTS[i % len(PROMPTS)], METHODS[i % len(METHODS)])
            for app in ("split", "colocated") for i in range(8)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda job: _chat(served.urls[job[0]], *job[1:]), jobs))
    for job, resp in zip(jobs, answers):
        assert resp.choices[0].message.content == greedy(job[1], MAX_TOKENS), job
        # session-sticky routing: no request's state had to be rebuilt on another replica
        assert resp.usage.model_extra["speculative"]["resumes"] == 0, job


def test_bad_requests_get_4xx_naming_the_field(served):
    url = served.urls["split"] + "/chat/completions"
    ok = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        (b'{"model": "peftbd-tiny", "messages": [', 400, None, "not valid JSON"),
        (json.dumps({**ok, "max_tokens": "8"}).encode(), 400, "max_tokens", "valid integer"),
        (json.dumps({**ok, "max_tokens": 4096}).encode(), 400, "max_tokens", "cap"),
        (json.dumps({**ok, "messages": [{"role": "user", "content": 5}]}).encode(), 400,
         "messages[0].content", "string"),
        (json.dumps({**ok, "model": "gpt-4o"}).encode(), 404, "model", "not served"),
        (json.dumps({**ok, "stop": ["\n"]}).encode(), 400, "stop", "unknown field"),
        (json.dumps({**ok, "pad": "x" * 2_000_000}).encode(), 413, None, "max_body_bytes"),
    ]
    for body, status, param, words in cases:
        resp = requests.post(url, data=body, headers={"content-type": "application/json"}, timeout=60)
        assert resp.status_code == status, (body[:60], resp.text)
        err = resp.json()["error"]
        assert err["param"] == param and words in err["message"], err
    with pytest.raises(openai.BadRequestError) as info:
        _client(served.urls["colocated"]).chat.completions.create(
            model=MODEL, messages=ok["messages"], temperature=0.8)
    assert info.value.body["param"] == "temperature" and "greedily" in info.value.body["message"]


def test_round_metrics_are_exported_under_the_dashboard_names(served):
    names = set(re.findall(r"ray_peftbd_\w+?(?=_bucket|_sum|_count|_total|\{|\[)",
                           DASHBOARD.read_text()))
    assert {"ray_peftbd_draft_ms", "ray_peftbd_verify_ms", "ray_peftbd_transport_ms",
            "ray_peftbd_tokens_per_round"} <= names
    # counted only when a state is rebuilt / a draft token is accepted (untrained drafters here)
    wanted = names - {"ray_peftbd_session_resumes", "ray_peftbd_accepted_per_position"}
    url = f"http://127.0.0.1:{served.metrics_port}/metrics"
    deadline, text = time.time() + 90, ""
    while time.time() < deadline:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        if all(n in text for n in wanted):
            break
        time.sleep(5)
    assert not [n for n in wanted if n not in text], "not exported yet"
    assert re.search(r'ray_peftbd_draft_ms_bucket\{[^}]*placement="split"', text)
    assert re.search(r'ray_peftbd_proposed_per_position_total\{[^}]*position="1"', text)


def test_killed_drafter_replica_mid_request_recovers(served, engine):
    """Kill every Drafter replica process while a streamed request is mid-way: the request
    resumes on a new replica from its committed tokens and the answer is still the engine's."""
    _, greedy = engine
    pids = served.replica_pids("split", "Drafter")  # looked up first: the CLI takes seconds
    assert len(pids) == 2
    stream = _client(served.urls["split"]).chat.completions.create(
        model=f"{MODEL}:fastmtp", messages=[{"role": "user", "content": LONG_PROMPT}],
        max_tokens=LONG_TOKENS, stream=True, stream_options={"include_usage": True},
    )
    pieces: list[str] = []
    chunks = iter(stream)
    for chunk in chunks:
        pieces.append(chunk.choices[0].delta.content or "")
        if len(pieces) == 3:
            break
    for pid in pids:  # replica processes of this test's own cluster
        os.kill(pid, signal.SIGKILL)
    rest = list(chunks)
    pieces += [c.choices[0].delta.content or "" for c in rest if c.choices]
    assert "".join(pieces) == greedy(LONG_PROMPT, LONG_TOKENS)
    assert rest[-1].usage.model_extra["speculative"]["resumes"] >= 1
