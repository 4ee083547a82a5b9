"""Which training failures Ray Train retries: a lost worker or node can heal on a restart from the
latest checkpoint (`FailureConfig(max_failures)`); an error that fails the same way every time
(config, data, a checkpoint of other shapes) is raised at once instead of retried.

Ray 2.60's public `FailureConfig` has no per-error filter, so `Trainer` hands the controller a
failure policy of its own (the controller's `failure_policy` argument: Ray Train V2 internals).
"""

from __future__ import annotations

import logging
from typing import Any

from ray.train.torch import TorchTrainer
from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision
from ray.train.v2.api.exceptions import TrainingFailedError, WorkerGroupError

from peftbd.config import ConfigError
from peftbd.data.artifact import ArtifactError
from peftbd.training.checkpoint import CheckpointMismatch

log = logging.getLogger(__name__)
NOT_RETRIED = "[NoRetryOfUnhealable] RAISE, not retried"
"""What the policy logs (in the controller's log) when it refuses a retry."""

UNHEALABLE: tuple[type[BaseException], ...] = (ConfigError, ArtifactError, CheckpointMismatch)
"""Errors a rerun of the same worker code on the same inputs raises again."""


def unhealable(error: BaseException) -> BaseException | None:
    """The unhealable error a worker raised (Ray wraps it with its traceback), else None."""
    base = getattr(error, "_base_exc", error)  # UserExceptionWithTraceback
    return base if isinstance(base, UNHEALABLE) else None


def raise_unhealable(error: WorkerGroupError) -> None:
    """Raise the first unhealable error among the group's failures (as the worker raised it)."""
    for failure in error.worker_failures.values():
        if (base := unhealable(failure)) is not None:
            raise base from None


class NoRetryOfUnhealable(DefaultFailurePolicy):
    """Ray Train's default policy, except that a worker group failing with an unhealable error
    is not retried."""

    def make_decision(self, training_failed_error: TrainingFailedError) -> FailureDecision:
        if isinstance(training_failed_error, WorkerGroupError):
            errors = [unhealable(e) for e in training_failed_error.worker_failures.values()]
            if first := next((e for e in errors if e is not None), None):
                log.warning("%s: %s", NOT_RETRIED, first)
                return FailureDecision.RAISE
        return super().make_decision(training_failed_error)


class Trainer(TorchTrainer):
    """A `TorchTrainer` whose controller does not retry unhealable errors."""

    def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
        controller_init_kwargs["failure_policy"] = NoRetryOfUnhealable(self.run_config.failure_config)
        return super()._initialize_and_run_controller(**controller_init_kwargs)
