"""The tiny world shipped with the package: current for the code and the tiny preset, copied in
by the world stage, and rebuilt by its recipe."""

from __future__ import annotations

import dataclasses
import json

import pytest

from peftbd.config import load_config
from peftbd.tiny_world import build
from peftbd.tiny_world.build import world_call
from peftbd.tiny_world.shipped import MANIFEST, SHIPPED, copy_shipped, shipped_fingerprint


def test_the_shipped_world_is_current(tmp_path):
    tw = load_config("tiny").tiny_world
    assert shipped_fingerprint() == world_call(tw, str(tmp_path)).inputs().fingerprint, (
        "the shipped world was built by other code or tiny_world settings than today's: "
        "rebuild it with python -m peftbd.tiny_world.refresh (~6 min) and commit it")


def test_the_world_stage_copies_the_shipped_world_in(tmp_path, monkeypatch):
    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path))  # its own cache, not the test session's
    tw = load_config("tiny").tiny_world
    call = world_call(tw, str(tmp_path))
    assert call.out.parent == tmp_path
    call.run()
    got, shipped = (json.loads((d / MANIFEST).read_text()) for d in (call.out, SHIPPED))
    assert got["origin"] == "shipped"
    assert got["sha256"] == shipped["sha256"]
    assert got["contract"]["run_id"] == shipped["contract"]["run_id"]  # the same world, the same run
    assert (call.out / "verifier" / "model.safetensors").read_bytes() == \
        (SHIPPED / "verifier" / "model.safetensors").read_bytes()


def test_other_settings_or_code_get_no_shipped_world(tmp_path):
    other = dataclasses.replace(load_config("tiny").tiny_world, seed=1)
    assert copy_shipped(world_call(other, str(tmp_path)).inputs().fingerprint, tmp_path / "w") is None
    assert not (tmp_path / "w").exists()


def test_shipped_false_is_not_part_of_the_fingerprint(tmp_path):
    tw = load_config("tiny").tiny_world
    off = dataclasses.replace(tw, shipped=False)
    assert world_call(tw, str(tmp_path)).inputs().fingerprint == \
        world_call(off, str(tmp_path)).inputs().fingerprint


@pytest.mark.slow
def test_the_recipe_rebuilds_the_shipped_world_on_a_short_schedule(tmp_path, monkeypatch):
    """Corpus and tokenizer to the byte, and the verifier's training end to end on a short
    schedule (the shipped one's 3,200 steps take ~6 min: `python -m peftbd.tiny_world.refresh`
    rebuilds it whole; `test_the_shipped_world_is_current` holds its fingerprint to the recipe).
    One thread: the suite runs two workers on two cores, and two spin-waiting threads here slowed
    the build ~3x beside the other worker."""
    monkeypatch.setattr(build, "BUILD_THREADS", 1)
    tw = dataclasses.replace(load_config("tiny").tiny_world, train_steps=40)
    built = build.build_tiny_world(tw, tmp_path / "world").manifest()
    shipped = json.loads((SHIPPED / MANIFEST).read_text())
    assert built["sha256"]["corpus"] == shipped["sha256"]["corpus"]
    assert built["sha256"]["tokenizer"] == shipped["sha256"]["tokenizer"]
    assert built["train_steps"] == 40 and built["parameters"] == shipped["parameters"]
    assert built["heldout_loss_nats"] < built["unigram_entropy_nats"]  # it learned something
    assert shipped["heldout_loss_nats"] < 0.1 * built["heldout_loss_nats"]  # the whole schedule: far more
