"""A job whose Ray resources are held elsewhere says so within seconds and gives up after the
bounded wait; with its resources free it goes on at once (local Ray, no models)."""

from __future__ import annotations

import time

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from jobs.ray_env import init_ray
from jobs.resources import ResourcesUnavailable, wait_for_resources
from peftbd import progress

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local_ray():
    ray.shutdown()
    init_ray(num_cpus=4)
    yield
    ray.shutdown()


def test_held_resources_are_named_within_seconds_and_the_wait_is_bounded(local_ray):
    holder = placement_group([{"CPU": 1}] * 4)  # e.g. a Serve app holding every CPU
    assert holder.wait(timeout_seconds=30)
    notes: list[tuple[float, str]] = []
    start = time.monotonic()
    try:
        with progress.listening(lambda done, total, **info: notes.append(
                (time.monotonic() - start, info.get("note", "")))):
            with pytest.raises(ResourcesUnavailable) as err:
                wait_for_resources("generate (2 verifier actors)", [{"CPU": 1.0, "GPU": 0.0}] * 2,
                                   timeout_s=6)
        elapsed = time.monotonic() - start
    finally:
        remove_placement_group(holder)
    situation = ("generate (2 verifier actors) needs 2 x {CPU: 1} = {CPU: 2}; free now {CPU: 0} "
                 "of {CPU: 4}")
    assert len(notes) == 1 and notes[0][0] < 5
    assert notes[0][1] == (f"waiting up to 6 s for Ray resources: {situation} "
                           f"(stop: ray job stop <job id>, or Ctrl-C)")
    assert 6 <= elapsed < 10
    assert str(err.value).startswith(f"gave up after 6 s waiting for Ray resources: {situation}; ")
    assert str(err.value).endswith("or wait longer (PEFTBD_RESOURCE_WAIT_S=SECONDS)")


def test_free_resources_go_on_at_once_and_release_the_reservation(local_ray):
    start = time.monotonic()
    wait_for_resources("training (2 Ray Train workers)", [{"CPU": 1.0, "GPU": 0.0}] * 2, timeout_s=30)
    assert time.monotonic() - start < 3
    deadline = time.monotonic() + 10
    while ray.available_resources().get("CPU") != 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU") == 4
