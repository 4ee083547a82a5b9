"""A plugin method (tests/plugins/toy_bigram_drafter.py, outside the project's packages) served by
both Serve apps with no edit to the project: the apps' arguments name it in
`overrides: [methods.plugins=[toy_bigram_drafter]]`, every replica imports it, and a request for
`<model>:toy_bigram` drafts with it (its stats say so) and returns AR's greedy text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGINS = REPO / "tests" / "plugins"

SCRIPT = r'''
import json, socket, sys, urllib.request
import ray
from ray import serve
from serve_apps import colocated, split
from serve_apps.args import AppArgs

with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
ray.init(num_cpus=4, include_dashboard=False)
serve.start(http_options={"host": "127.0.0.1", "port": port})
args = AppArgs(overrides=["methods.plugins=[toy_bigram_drafter]", "serving.max_tokens_cap=24"])
serve.run(colocated.build(args), name="colocated", route_prefix="/colocated")
serve.run(split.build(args), name="split", route_prefix="/split")
out = {}
for app in ("colocated", "split"):
    for method in ("ar", "toy_bigram"):
        body = json.dumps({"model": f"peftbd-tiny:{method}", "max_tokens": 24, "temperature": 0,
                           "messages": [{"role": "user", "content": "Count from 3 to 11."}]}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/{app}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(req, timeout=300))
        out[f"{app}:{method}"] = {"text": reply["choices"][0]["message"]["content"],
                                  "speculative": reply["usage"]["speculative"]}
serve.shutdown()
ray.shutdown()
print("RESULT " + json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.integration
def test_a_plugin_method_is_served_by_both_apps_with_no_project_edit(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(REPO)]),
           "RAY_ADDRESS": "", "PEFTBD_RAY_DASHBOARD": "0"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for app in ("colocated", "split"):
        toy, ar = out[f"{app}:toy_bigram"], out[f"{app}:ar"]
        assert toy["text"] == ar["text"] and toy["text"], app  # exact: AR's greedy text
        assert toy["speculative"]["method"] == "toy_bigram", app
        assert toy["speculative"]["proposed_tokens"] > 0, app  # the plugin's drafter drafted
