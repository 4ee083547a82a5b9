"""Before a job asks Ray for its actors or workers: are their resources free? Said within
seconds when they are not (what the job needs, what is free, which actors hold the rest), and
given up after a bounded wait (env `PEFTBD_RESOURCE_WAIT_S`, default 300 s) instead of sitting
"backpressured" without a word.

The check reserves the job's bundles as a placement group, so it waits exactly for what Ray's
scheduler would grant, and releases it at once when granted.
"""

from __future__ import annotations

import logging
import os
import time

import ray
from ray.util.placement_group import placement_group, remove_placement_group

from peftbd import progress
from peftbd.errors import UserError

log = logging.getLogger(__name__)
WAIT_ENV = "PEFTBD_RESOURCE_WAIT_S"
DEFAULT_WAIT_S = 300.0
NOTE_AFTER_S = 3.0  # a job that waits longer says so


class ResourcesUnavailable(UserError, RuntimeError):
    """The job's resources were not granted within the wait; the message says what it needs,
    what is free and what holds the rest."""


def resource_wait_s() -> float:
    """The bounded wait: `PEFTBD_RESOURCE_WAIT_S` seconds (default 300)."""
    return float(os.environ.get(WAIT_ENV, DEFAULT_WAIT_S))


def wait_for_resources(what: str, bundles: list[dict[str, float]],
                       timeout_s: float | None = None) -> None:
    """Wait until `bundles` (one per actor or worker) can all be placed; tell the progress
    listener after NOTE_AFTER_S what is missing; raise `ResourcesUnavailable` after `timeout_s`."""
    bundles = [{k: v for k, v in b.items() if v > 0} for b in bundles]
    bundles = [b for b in bundles if b]
    if not bundles:
        return
    timeout_s = resource_wait_s() if timeout_s is None else timeout_s
    pg = placement_group(bundles, strategy="SPREAD")
    deadline, noted = time.monotonic() + timeout_s, False
    try:
        while (left := deadline - time.monotonic()) > 0:
            if pg.wait(timeout_seconds=left if noted else min(left, NOTE_AFTER_S)):
                return
            if not noted:
                note = (f"waiting up to {timeout_s:.0f} s for Ray resources: "
                        f"{_situation(what, bundles)} (stop: ray job stop <job id>, or Ctrl-C)")
                log.warning("%s", note)
                progress.report(0, 1, note=note)
                noted = True
        raise ResourcesUnavailable(
            f"gave up after {timeout_s:.0f} s waiting for Ray resources: {_situation(what, bundles)}; "
            f"free them (e.g. serve shutdown, ray job stop), lower the job's actors/workers or CPUs "
            f"per actor, or wait longer ({WAIT_ENV}=SECONDS)"
        )
    finally:
        remove_placement_group(pg)


def _situation(what: str, bundles: list[dict[str, float]]) -> str:
    needed: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            needed[k] = needed.get(k, 0) + v
    free, total = ray.available_resources(), ray.cluster_resources()
    text = (f"{what} needs {len(bundles)} x {_show(bundles[0])} = {_show(needed)}; free now "
            f"{_show({k: free.get(k, 0.0) for k in needed})} of {_show({k: total.get(k, 0.0) for k in needed})}")
    holders = _holders(needed)
    return text + (f"; held by {holders}" if holders else "")


def _holders(kinds: dict[str, float]) -> str:
    """Live actors holding any of these resources (needs the State API: the dashboard)."""
    try:
        from ray.util.state import list_actors

        actors = list_actors(filters=[("state", "=", "ALIVE")], detail=True, timeout=3,
                             raise_on_missing_output=False)
    except Exception:  # noqa: BLE001 - no dashboard / State API: say what we know without it
        return ""
    held = [f"{a.class_name} (pid {a.pid}, {_show(a.required_resources or {})})" for a in actors
            if any(k in (a.required_resources or {}) for k in kinds)]
    more = f" and {len(held) - 5} more actors" if len(held) > 5 else ""
    return ", ".join(held[:5]) + more


def _show(resources: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(resources.items())) + "}"
