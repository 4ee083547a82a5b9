"""The shipped YAMLs deploy with `serve deploy` on a `ray start` cluster (token auth) and answer:
the `served` fixture (conftest.py) deploys serve_apps/local.yaml, both apps, as shipped."""

from __future__ import annotations

import openai
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPT = "Describe the for statement."


def test_both_yaml_apps_run_every_deployment_healthy(served):
    apps = served.status()["applications"]
    for app in served.config["applications"]:
        status = apps[app["name"]]
        assert status["status"] == "RUNNING"
        assert set(status["deployments"]) == {d["name"] for d in app["deployments"]}
        assert all(d["status"] == "HEALTHY" for d in status["deployments"].values())
        for d in app["deployments"]:
            assert status["deployments"][d["name"]]["replica_states"] == {
                "RUNNING": d["num_replicas"]}


@pytest.mark.parametrize("app", ["colocated", "split"])
def test_deployed_yaml_app_answers_with_the_engine_output(served, engine, app):
    client = openai.OpenAI(base_url=served.urls[app], api_key="unused", max_retries=0, timeout=300)
    resp = client.chat.completions.create(
        model="peftbd-tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=16)
    _, greedy = engine
    assert resp.choices[0].message.content == greedy(PROMPT, 16)
