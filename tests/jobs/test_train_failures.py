"""Ray Train retries what can heal and raises at once what fails the same way every time (no
cluster: the failure policy on the errors Ray Train hands it)."""

from __future__ import annotations

import pytest
from ray.train import FailureConfig
from ray.train.torch import TorchTrainer
from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
from ray.train.v2._internal.execution.failure_handling import FailureDecision
from ray.train.v2.api.exceptions import WorkerGroupError

from jobs.train_failures import NoRetryOfUnhealable, Trainer, raise_unhealable
from peftbd.config import ConfigError
from peftbd.data.artifact import ArtifactError
from peftbd.training.checkpoint import CheckpointMismatch


def _group(error: BaseException) -> WorkerGroupError:
    """Rank 0 raised `error` (wrapped as Ray Train wraps it); rank 1 failed as a consequence."""
    return WorkerGroupError("workers failed", {0: UserExceptionWithTraceback(error, "Traceback ..."),
                                               1: RuntimeError("gloo: connection closed")})


@pytest.mark.parametrize("error", [ConfigError("bad value"), ArtifactError("no val rows"),
                                   CheckpointMismatch("other shapes; rerun with --no-resume")])
def test_unhealable_errors_are_raised_at_once_with_their_own_message(error):
    policy = NoRetryOfUnhealable(FailureConfig(max_failures=2))
    assert policy.make_decision(_group(error)) is FailureDecision.RAISE
    with pytest.raises(type(error)) as raised:
        raise_unhealable(_group(error))
    assert raised.value is error


def test_other_failures_are_retried_up_to_max_failures():
    policy = NoRetryOfUnhealable(FailureConfig(max_failures=2))
    lost = _group(RuntimeError("worker died"))
    assert [policy.make_decision(lost) for _ in range(3)] == [
        FailureDecision.RETRY, FailureDecision.RETRY, FailureDecision.RAISE]
    raise_unhealable(lost)  # nothing unhealable: returns, the caller re-raises the group error


def test_the_trainer_hands_its_controller_this_policy(monkeypatch):
    seen = {}
    monkeypatch.setattr(TorchTrainer, "_initialize_and_run_controller",
                        lambda self, **kwargs: seen.update(kwargs))
    trainer = Trainer(lambda: None)
    trainer._initialize_and_run_controller(failure_policy=None, other="kept")
    assert isinstance(seen["failure_policy"], NoRetryOfUnhealable) and seen["other"] == "kept"
