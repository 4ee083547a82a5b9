"""The placement job: its placement options and its pieces (no Ray); the job as users submit it:
tests/jobs/test_job_submit.py."""

from __future__ import annotations

import pickle
import zlib

import pytest

from jobs.placement import _busy, _overrides, _skipped_some
from jobs.placement_options import placement_options, replica_counts, skip_reason
from peftbd.analysis.placement_verdict import PlacementReport
from peftbd.config import load_config
from peftbd.serving.messages import ReplicaStats
from peftbd.serving.roles import MODEL_ROLES, Role


def test_cluster_placements_need_the_cluster_yaml_resources():
    cfg = load_config("qwen3-0.6b")
    app, opts = placement_options("split-same-node", cfg)
    assert app == "split"
    assert opts["drafter"]["ray_actor_options"]["resources"] == {"verifier": 0.5}
    assert opts["drafter"]["ray_actor_options"]["num_gpus"] == 0.5
    assert skip_reason(opts, {"CPU": 4.0}) is not None
    assert skip_reason(opts, {"CPU": 4.0, "verifier": 1.0, "GPU": 1.0}) is None
    app, opts = placement_options("colocated", cfg)  # split's devices: one Engine each
    assert app == "colocated" and opts["engine"]["num_replicas"] == 2
    with pytest.raises(ValueError, match="unknown placement"):
        placement_options("moon", cfg)


def test_every_drafter_dir_is_an_upstream_of_the_experiment(tmp_path):
    from jobs.placement import placement_call
    from peftbd.layout import placement_stage
    from peftbd.methods import methods

    assert {m.stage.name for m in methods() if m.stage} == {s.name for s in placement_stage().inputs}
    call = placement_call(load_config("tiny"), tmp_path / "out", {"peftbd_head": str(tmp_path / "h")})
    assert call.upstream == {"train_peftbd_head": tmp_path / "h"}


def test_each_registered_method_has_its_dir_flag(tmp_path, monkeypatch):
    import jobs.placement as placement
    from peftbd.methods import methods

    seen = {}

    def call(cfg, out, dirs):
        seen.update(dirs)
        raise SystemExit(0)

    monkeypatch.setattr(placement, "placement_call", call)
    monkeypatch.setattr(placement, "run_stage_job", lambda stage, out, call, *a, **k: call())
    with pytest.raises(SystemExit):
        placement.main(["--peftbd-head-dir", "h", "--fastmtp-dir", "m", "--out", str(tmp_path)])
    assert seen == {m.serving: None for m in methods()} | {"fastmtp": "m", "peftbd_head": "h"}


class _StatsHandle:
    """A model deployment's handle stand-in: `stats()` answers a `ReplicaStats` (pickled, as Ray
    sends it) of one of `replicas`, picked by the probe's session id."""

    def __init__(self, replicas: int) -> None:
        self.replicas, self.session = replicas, ""

    def options(self, session_id: str) -> _StatsHandle:
        picked = _StatsHandle(self.replicas)
        picked.session = session_id
        return picked

    @property
    def stats(self) -> _StatsHandle:
        return self

    def remote(self) -> _StatsHandle:
        return self

    def result(self) -> ReplicaStats:
        n = zlib.crc32(self.session.encode()) % self.replicas
        stats = ReplicaStats(replica=f"r{n}", sessions=0, streams=0, busy_s=1.5 * n,
                             batch_sizes={1: 3})
        return pickle.loads(pickle.dumps(stats))


def test_replica_loads_are_read_from_the_typed_stats_of_every_replica():
    busy = _busy({"drafter": (_StatsHandle(2), 2), "verifier": (_StatsHandle(1), 1)})
    assert busy == {"drafter": {"r0": 0.0, "r1": 1.5}, "verifier": {"r0": 0.0}}


def test_each_app_counts_the_replicas_of_its_model_roles():
    cfg = load_config("qwen3-0.6b")
    for name in ("colocated", "split-fractional-gpu", "split"):
        app, options = placement_options(name, cfg)
        counts = replica_counts(app, options, cfg)
        assert tuple(counts) == MODEL_ROLES[app]
    assert replica_counts(*placement_options("colocated", cfg), cfg) == {Role.ENGINE: 2}
    assert replica_counts(*placement_options("split-fractional-gpu", cfg), cfg) == {
        Role.DRAFTER: 2, Role.VERIFIER: 2}
    assert [r.deployment for r in replica_counts("split", {}, cfg)] == ["Drafter", "Verifier"]


def test_a_local_cluster_rerun_rebuilds_an_output_that_skipped_placements(tmp_path):
    assert not _skipped_some(tmp_path)  # nothing there yet
    report = PlacementReport(summary={}, concurrency=[], skipped={}, notes=[], devices={},
                             verdicts=[], outputs_identical=True, requests=[])
    report.write(tmp_path)
    assert not _skipped_some(tmp_path)
    report.model_copy(update={"skipped": {"split-cross-node": "why"}}).write(tmp_path)
    assert _skipped_some(tmp_path)
    (tmp_path / "placement.json").write_text('{"skipped": {}}')  # of another shape: rebuilt
    assert _skipped_some(tmp_path)


def test_a_level_sends_every_prompt_or_at_least_one_request_per_client():
    from jobs.placement import level_prompts

    every = load_config("tiny", overrides=["decoding.repeats=2"])
    assert level_prompts(3, every, 16) == [0, 1, 2, 0, 1, 2]
    fewer = load_config("placement-0.6b")
    assert fewer.serving.level_requests == 6
    assert [len(level_prompts(8, fewer, c)) for c in (1, 8, 32)] == [6, 8, 32]
    assert level_prompts(3, fewer, 4) == [0, 1, 2, 0, 1, 2]


def test_split_ahead_runs_only_its_levels():
    from jobs.placement_options import CONFIG_CHANGES, placement_levels, placement_options

    cfg = load_config("placement-0.6b")
    assert placement_levels("split-ahead", cfg) == (1,)
    assert placement_levels("split", cfg) == cfg.serving.client_concurrency
    assert placement_options("split-ahead", cfg)[0] == "split"
    assert load_config("placement-0.6b", overrides=CONFIG_CHANGES["split-ahead"]).serving.draft_ahead


def test_overrides_rebuild_the_config_from_its_preset():
    cfg = load_config("tiny", overrides=["decoding.num_prompts=3", "serving.placements=[split]"])
    assert load_config("tiny", overrides=_overrides(cfg)) == cfg
