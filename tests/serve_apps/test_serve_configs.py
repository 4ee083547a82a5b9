"""The serve config YAMLs and the Grafana dashboard, checked without starting Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from peftbd.config import load_config
from serve_apps.args import SESSION_ROUTER, AppArgs, actor_options
from serve_apps.metrics import COUNTERS, HISTOGRAMS

REPO = Path(__file__).resolve().parents[2]
APPS = REPO / "serve_apps"


def _config(name: str) -> dict:
    return yaml.safe_load((APPS / f"{name}.yaml").read_text())


@pytest.mark.parametrize(
    ("name", "deployments"),
    [("colocated", {"Engine", "Ingress"}), ("split", {"Drafter", "Verifier", "Ingress"}),
     ("split_cluster", {"Drafter", "Verifier", "Ingress"})],
)
def test_yaml_is_a_valid_serve_config_of_the_app(name, deployments):
    schema = ServeDeploySchema.model_validate(_config(name))
    (app,) = schema.applications
    assert app.import_path == f"serve_apps.{name.split('_')[0]}:app_builder"
    AppArgs.model_validate(app.args)  # the builder accepts the args
    assert {d.name for d in app.deployments} == deployments
    for d in app.deployments:
        if d.name in ("Drafter", "Verifier"):  # session-sticky routing survives `serve deploy`
            assert d.request_router_config == SESSION_ROUTER


@pytest.mark.parametrize("name", ["colocated", "split"])
def test_local_yaml_matches_the_tiny_config_and_listens_on_loopback(name):
    cfg = load_config("tiny")
    conf = _config(name)
    assert conf["http_options"]["host"] == "127.0.0.1"
    roles = {"Engine": "engine", "Drafter": "drafter", "Verifier": "verifier", "Ingress": "ingress"}
    for d in conf["applications"][0]["deployments"]:
        expected = actor_options(cfg, roles[d["name"]])
        assert d["num_replicas"] == expected["num_replicas"]
        assert d["ray_actor_options"] == expected["ray_actor_options"]


@pytest.mark.parametrize("name", ["colocated", "split"])
def test_builder_takes_the_yaml_args_as_serve_deploy_passes_them(name):
    from ray.serve import Application
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    import_path = _config(name)["applications"][0]["import_path"]
    module, attr = import_path.split(":")
    builder = getattr(__import__(module, fromlist=[attr]), attr)
    args = _config(name)["applications"][0]["args"]  # a plain dict, as in the YAML
    assert isinstance(call_user_app_builder_with_args_if_necessary(builder, args), Application)


def test_cluster_yaml_targets_the_drafter_and_verifier_worker_resources():
    deployments = {d["name"]: d for d in _config("split_cluster")["applications"][0]["deployments"]}
    wanted = {name: set(deployments[name]["ray_actor_options"]["resources"])
              for name in ("Drafter", "Verifier")}
    assert wanted == {"Drafter": {"drafter"}, "Verifier": {"verifier"}}
    assert all(deployments[n]["ray_actor_options"]["num_gpus"] >= 1 for n in wanted)
    cluster = yaml.safe_load((REPO / "cluster.yaml").read_text())
    node_types = cluster.get("available_node_types") or {}
    if not node_types:
        pytest.skip("cluster.yaml has no available_node_types yet (placeholder)")
    offered = {res for t in node_types.values() for res in (t.get("resources") or {})}
    assert {"drafter", "verifier"} <= offered, f"cluster.yaml offers {sorted(offered)}"


def test_dashboard_plots_every_round_histogram_and_counter():
    dash = json.loads((APPS / "grafana_dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for name in HISTOGRAMS:
        assert f"ray_{name}_bucket" in exprs or f"ray_{name}_sum" in exprs, name
    for name in COUNTERS:
        assert f"ray_{name}_total" in exprs, name
    rate = next(t["expr"] for p in dash["panels"] for t in p["targets"]
                if "accepted_per_position" in t["expr"])
    assert rate.count("by (placement, method, position)") == 3  # accepted / proposed per position
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "placement", "method"}
