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


DEPLOYMENTS = {"colocated": {"Engine", "Ingress"},
               "split": {"Drafter", "Verifier", "Ingress"}}


def test_each_deployment_is_named_by_its_role():
    """One name per role (`peftbd.serving.roles`): the deployments, the apps' YAMLs and the
    placement job's handles all say it."""
    from peftbd.serving.roles import APP_ROLES, MODEL_ROLES, Role
    from serve_apps.deployments import Drafter, Engine, Verifier, deployment_of
    from serve_apps.ingress import Ingress

    by_role = {Role.ENGINE: Engine, Role.DRAFTER: Drafter, Role.VERIFIER: Verifier,
               Role.INGRESS: Ingress}
    assert {role: deployment_of(d).name for role, d in by_role.items()} == {
        role: role.deployment for role in Role}
    assert DEPLOYMENTS == {app: {r.deployment for r in roles} for app, roles in APP_ROLES.items()}
    assert all(set(MODEL_ROLES[app]) <= set(roles) for app, roles in APP_ROLES.items())
    with pytest.raises(TypeError, match="no Serve deployment"):
        deployment_of(object())


def _apps(name: str) -> list[dict]:
    return _config(name)["applications"]


@pytest.mark.parametrize("name", ["local", "split_cluster"])
def test_yaml_is_a_valid_serve_config_of_the_apps(name):
    schema = ServeDeploySchema.model_validate(_config(name))
    assert {a.name for a in schema.applications} == (
        {"colocated", "split"} if name == "local" else {"split"})
    assert len({a.route_prefix for a in schema.applications}) == len(schema.applications)
    for app in schema.applications:
        assert app.import_path == f"serve_apps.{app.name}:app_builder"
        args = AppArgs.model_validate(app.args)  # the builder accepts the args
        assert {"peftbd_dir", "fastmtp_dir", "peftbd_head_dir"} <= set(app.args)  # the paper's drafters
        assert args.drafter_dirs == {}  # untrained unless set (any registered method's too)
        assert {d.name for d in app.deployments} == DEPLOYMENTS[app.name]
        for d in app.deployments:
            if d.name == "Drafter":  # session-sticky routing survives `serve deploy`
                assert d.request_router_config == SESSION_ROUTER
            if d.name == "Ingress":  # redundancy: losing one fails only its own requests
                assert d.num_replicas >= 2


def test_local_yaml_fits_this_2_cpu_box_on_loopback():
    """Every replica of both apps is scheduled on `ray start --head` with 2 CPUs, Ingress included
    (the issue: Drafter 1 + Verifier 1 CPU left nothing for it)."""
    conf = _config("local")
    assert conf["http_options"]["host"] == "127.0.0.1"
    cpus = sum(d["num_replicas"] * d["ray_actor_options"]["num_cpus"]
               for app in conf["applications"] for d in app["deployments"])
    assert cpus <= 2
    assert {a["route_prefix"] for a in conf["applications"]} == {"/colocated", "/split"}
    drafter = next(d for a in conf["applications"] for d in a["deployments"] if d["name"] == "Drafter")
    assert drafter["num_replicas"] == 2  # so that sticky routing has a choice to get wrong


def test_builders_give_two_ingress_replicas():
    assert actor_options(load_config("tiny"), "ingress")["num_replicas"] == 2


@pytest.mark.parametrize("app", _apps("local"), ids=lambda a: a["name"])
def test_builder_takes_the_yaml_args_as_serve_deploy_passes_them(app):
    from ray.serve import Application
    from ray.serve._private.api import call_user_app_builder_with_args_if_necessary

    module, attr = app["import_path"].split(":")
    builder = getattr(__import__(module, fromlist=[attr]), attr)
    assert isinstance(call_user_app_builder_with_args_if_necessary(builder, app["args"]), Application)


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
        assert f"ray_{name}_bucket" in exprs, name
    for name in COUNTERS:
        assert f"ray_{name}_total" in exprs, name
    rate = next(t["expr"] for p in dash["panels"] for t in p["targets"]
                if "accepted_per_position" in t["expr"])
    assert rate.count("by (placement, method, position)") == 3  # accepted / proposed per position
    assert {v["name"] for v in dash["templating"]["list"]} == {"datasource", "placement", "method"}
