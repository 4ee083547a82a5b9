"""Starting (or joining) Ray the same way in every job."""

from __future__ import annotations

import logging
import os

import ray

log = logging.getLogger(__name__)


def init_ray(num_cpus: int | None = None) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), else start a local one.

    Locally Ray gets at least 4 logical CPUs even on a 2-core machine: actors with fractional
    CPUs plus Ray Data's read tasks otherwise deadlock waiting for a free CPU.
    """
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
    else:
        ray.init(num_cpus=num_cpus or max(4, os.cpu_count() or 1), include_dashboard=False,
                 log_to_driver=True)
    log.info("ray resources: %s", ray.cluster_resources())
