"""Starting (or joining) Ray the same way in every job."""

from __future__ import annotations

import logging
import os

import ray

log = logging.getLogger(__name__)
DASHBOARD_ENV = "PEFTBD_RAY_DASHBOARD"


def init_ray(num_cpus: int | None = None) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), else start a local one.

    Locally Ray gets at least 4 logical CPUs even on a 2-core machine: actors with fractional
    CPUs plus Ray Data's read tasks otherwise deadlock waiting for a free CPU. The local dashboard
    (http://127.0.0.1:8265: jobs, actors, Ray Data and Train progress) starts unless
    PEFTBD_RAY_DASHBOARD=0; without it Ray Train's placement-group cleaner, which polls the State
    API, logs a warning every few seconds.
    """
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=True)
    else:
        context = ray.init(num_cpus=num_cpus or max(4, os.cpu_count() or 1), log_to_driver=True,
                           include_dashboard=os.environ.get(DASHBOARD_ENV, "1") != "0")
        if context.dashboard_url:
            log.info("ray dashboard: http://%s", context.dashboard_url)
    log.info("ray resources: %s", ray.cluster_resources())


def shutdown() -> None:
    """Stop this process's Ray connection (local Ray: the cluster), if any."""
    if ray.is_initialized():
        ray.shutdown()
