"""The typed messages that cross Ray between the serving processes: a colocated Engine's
`RoundEvent`s and a model replica's `ReplicaStats` travel as themselves (Ray pickles them), and
the stats' plain form (for a probe that prints JSON) reads back as the same object."""

from __future__ import annotations

import dataclasses
import json
import pickle

import pytest

from peftbd.serving.messages import ReplicaStats
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.roles import DEPLOYMENT_NAMES, MODEL_ROLES, Role
from peftbd.serving.rounds import RoundEvent


def test_a_round_event_survives_pickling_as_itself():
    event = RoundEvent(tokens=[5, 6, 7], proposed=4, accepted=2, draft_ms=1.5, verify_ms=2.5,
                       sync_ms=0.25, other_ms=0.125, resumes=1, feature_bytes=96, batch_size=3,
                       done=True, finish_reason="stop")
    back = pickle.loads(pickle.dumps(event))
    assert type(back) is RoundEvent and back == event
    assert not hasattr(event, "to_dict")  # no dict form: the stream carries the event itself


@pytest.fixture(scope="module")
def replica(tiny_cfg):
    from peftbd.serving.models import load_serving_models

    return ReplicaDecoder(load_serving_models(tiny_cfg, ("ar",)), 4)


def test_replica_stats_are_typed_and_survive_pickling_and_json(replica):
    list(replica.rounds([1, 2, 3], 4, "ar"))  # one colocated request: a prefill and rounds
    stats = replica.stats("replica-1")
    assert type(stats) is ReplicaStats
    assert (stats.replica, stats.sessions, stats.streams) == ("replica-1", 0, 0)
    assert stats.rounds >= 1 and stats.batch_sizes and stats.busy_s > 0
    assert stats.batch_sizes == dict(replica.batch_sizes)
    assert pickle.loads(pickle.dumps(stats)) == stats
    plain = json.loads(json.dumps(stats.to_dict()))  # batch_sizes' keys become strings
    assert ReplicaStats.from_dict(plain) == stats
    assert set(plain) == {f.name for f in dataclasses.fields(ReplicaStats)}


def test_every_role_has_one_deployment_name():
    assert set(DEPLOYMENT_NAMES) == set(Role)
    assert [r.deployment for r in Role] == ["Ingress", "Engine", "Drafter", "Verifier"]
    assert f"{Role.ENGINE}" == str(Role.ENGINE) == "engine"  # a role reads as its key
    assert {"engine": 1}[Role.ENGINE] == 1  # and looks up its key's entries
    assert MODEL_ROLES == {"colocated": (Role.ENGINE,), "split": (Role.DRAFTER, Role.VERIFIER)}
