"""Which training failures Ray Train retries: a lost worker or node can heal on a restart from the
latest checkpoint (`FailureConfig(max_failures)`); an error that fails the same way every time
(config, data, a checkpoint of other shapes) is raised at once instead of retried.

Ray 2.60's public `FailureConfig` has no per-error filter, so `Trainer` hands the controller a
failure policy of its own (the controller's `failure_policy` argument: Ray Train V2 internals).
"""

from __future__ import annotations

import logging
from typing import Any, cast

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision
from ray.train.v2.api.config import FailureConfig
from ray.train.v2.api.exceptions import TrainingFailedError, WorkerGroupError

from peftbd.config import ConfigError
from peftbd.data.artifact import ArtifactError
from peftbd.training.checkpoint import CheckpointMismatch

log = logging.getLogger(__name__)
NOT_RETRIED = "[NoRetryOfUnhealable] RAISE, not retried"
"""What the policy logs (in the controller's log) when it refuses a retry."""

UNHEALABLE: tuple[type[BaseException], ...] = (ConfigError, ArtifactError, CheckpointMismatch)
"""Errors a rerun of the same worker code on the same inputs raises again."""


def unhealable(error: TrainingFailedError) -> BaseException | None:
    """The first unhealable error a worker of the group raised (as it raised it; Ray wraps it
    with its traceback), else None."""
    if not isinstance(error, WorkerGroupError):
        return None
    for failure in error.worker_failures.values():
        base = getattr(failure, "_base_exc", failure)  # UserExceptionWithTraceback
        if isinstance(base, UNHEALABLE):
            return base
    return None


def raise_unhealable(error: TrainingFailedError) -> None:
    """Raise the group's unhealable error, if any (the caller re-raises `error` otherwise)."""
    if (base := unhealable(error)) is not None:
        raise base from None


class NoRetryOfUnhealable(DefaultFailurePolicy):
    """Ray Train's default policy, except that a worker group failing with an unhealable error
    is not retried."""

    def make_decision(self, training_failed_error: TrainingFailedError) -> FailureDecision:
        if (base := unhealable(training_failed_error)) is not None:
            log.warning("%s: %s", NOT_RETRIED, base)
            return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


class Trainer(TorchTrainer):
    """A `TorchTrainer` whose controller does not retry unhealable errors."""

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        # Ray Train V2's RunConfig fills in its own FailureConfig (`ray.train.FailureConfig`)
        failure = cast(FailureConfig, self.run_config.failure_config)
        controller_init_kwargs["failure_policy"] = NoRetryOfUnhealable(failure)
        # the type checker reads `ray.train.torch`'s V1 TorchTrainer; Ray Train V2 (the default,
        # this module's policy is V2's) gives the V2 one, which has this method
        return super()._initialize_and_run_controller(  # type: ignore[misc]
            **controller_init_kwargs)
