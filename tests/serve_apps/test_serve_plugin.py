"""A plugin method (tests/plugins/toy_bigram_drafter.py, outside the project's packages) served by
both Serve apps with no edit to the project: the apps' arguments name it in
`overrides: [methods.plugins=[toy_bigram_drafter]]`, every replica imports it (its directory on
the apps' PYTHONPATH), and a request for `<model>:toy_bigram` drafts with it (its stats say so)
and returns AR's greedy text.

The plugin's apps are deployed with `serve deploy` beside the shipped ones on the `served` cluster
(conftest.py; one replica of each deployment, small CPU shares, so that all fit its 2 CPUs), and
removed afterwards."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "plugins"
PLUGIN_OVERRIDES = ["methods.plugins=[toy_bigram_drafter]", "serving.max_tokens_cap=24",
                    "serving.drafter_replicas=1"]  # = the Drafter's one replica below

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def plugin_app(app: dict) -> dict:
    """One shipped app, renamed, its arguments naming the plugin and its replicas importing it."""
    app = copy.deepcopy(app)
    app["name"] = f"{app['name']}_plugin"
    app["route_prefix"] = f"/{app['name']}"
    app["args"]["overrides"] = [o for o in app["args"]["overrides"]
                                if not o.startswith("serving.drafter_replicas=")] + PLUGIN_OVERRIDES
    path = [str(PLUGINS), str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    app["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join(path)}}
    for d in app["deployments"]:
        d["num_replicas"] = 1
        d["ray_actor_options"]["num_cpus"] = 0.05
    return app


@pytest.fixture(scope="module")
def plugin_urls(served, tmp_path_factory):
    """{shipped app name: its plugin twin's URL}, the shipped apps left running as they were."""
    apps = [plugin_app(a) for a in served.config["applications"]]
    both = {**served.config, "applications": [*served.config["applications"], *apps]}
    path = tmp_path_factory.mktemp("serve-plugin") / "apps.yaml"
    served.deploy(both, path)
    try:
        yield {a["name"].removesuffix("_plugin"): served.url(a) for a in apps}
    finally:
        served.deploy(served.config, path)


def test_a_plugin_method_is_served_by_both_apps_with_no_project_edit(served, plugin_urls):
    for app, url in plugin_urls.items():
        out = {}
        for method in ("ar", "toy_bigram"):
            body = {"model": f"{served.model}:{method}", "max_tokens": 24, "temperature": 0,
                    "messages": [{"role": "user", "content": "Count from 3 to 11."}]}
            reply = requests.post(f"{url}/chat/completions", json=body, timeout=300)
            assert reply.status_code == 200, reply.text
            reply = reply.json()
            out[method] = {"text": reply["choices"][0]["message"]["content"],
                           "speculative": reply["usage"]["speculative"]}
        toy, ar = out["toy_bigram"], out["ar"]
        assert toy["text"] == ar["text"] and toy["text"], app  # exact: AR's greedy text
        assert toy["speculative"]["method"] == "toy_bigram", app
        assert toy["speculative"]["proposed_tokens"] > 0, app  # the plugin's drafter drafted
