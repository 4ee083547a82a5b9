"""The stage contract: what decides a stage, when it is skipped, atomic output, older layouts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from peftbd.manifest import is_complete, read_manifest, write_manifest
from peftbd.stage import (
    StageError,
    StageSpec,
    Upstream,
    config_values,
    decide,
    lineage,
    run_stage,
    stage_inputs,
)

UP = StageSpec("up", "upstream", "up", reads=("a",), code=("peftbd.stage",))
DOWN = StageSpec("down", "downstream", "down", reads=("a.x", "b"), ignores=("b.where",),
                 inputs=(UP,), code=("peftbd.manifest",), command="python -m jobs.down")
CFG = {"a": {"x": 1, "y": 2}, "b": {"k": "v", "where": "/tmp"}, "c": 3}


def _write(text: str):
    def build(tmp: Path, _inputs) -> dict:
        (tmp / "out.txt").write_text(text)
        return {"note": text}
    return build


def _run(spec, cfg, out, upstream=None, text="x", force=False):
    inputs = stage_inputs(spec, cfg, upstream or {})
    return run_stage(inputs, out, _write(text), cfg, force=force)


def test_config_values_are_the_declared_sections_and_keys_minus_ignores():
    assert config_values(DOWN, CFG) == {"a.x": 1, "b.k": "v"}
    assert config_values(UP, CFG) == {"a.x": 1, "a.y": 2}
    with pytest.raises(KeyError, match="unknown config key 'nope'"):
        config_values(StageSpec("s", "s", "s", reads=("nope",)), CFG)


def test_fingerprint_follows_read_values_code_and_upstream_only():
    base = stage_inputs(DOWN, CFG, {})
    assert stage_inputs(DOWN, {**CFG, "c": 4}, {}).fingerprint == base.fingerprint  # not read
    moved = {**CFG, "b": {"k": "v", "where": "/elsewhere"}}
    assert stage_inputs(DOWN, moved, {}).fingerprint == base.fingerprint  # ignored
    assert stage_inputs(DOWN, {**CFG, "a": {"x": 2, "y": 2}}, {}).fingerprint != base.fingerprint
    assert dataclasses.replace(base, code={"peftbd/manifest.py": "0"}).fingerprint != base.fingerprint
    up = Upstream("f1", "r1", "/up")
    with_up = stage_inputs(DOWN, CFG, {"up": up})
    assert with_up.fingerprint != base.fingerprint
    rebuilt = stage_inputs(DOWN, CFG, {"up": dataclasses.replace(up, run_id="r2")})
    assert rebuilt.fingerprint == with_up.fingerprint  # the same inputs; the run id is checked apart
    assert "peftbd/manifest.py" in base.code


def test_a_stage_is_skipped_only_while_its_inputs_are_unchanged(tmp_path):
    up, down = tmp_path / "up", tmp_path / "down"
    assert decide(stage_inputs(UP, CFG, {}), up).reasons == ("no finished output yet",)
    assert _run(UP, CFG, up).run and is_complete(up)
    assert not _run(UP, CFG, up).run  # unchanged: skipped, output untouched
    _run(DOWN, CFG, down, {"up": Upstream.of(up)})
    current = stage_inputs(DOWN, CFG, {"up": Upstream.of(up)})
    assert not decide(current, down).run

    changed = decide(stage_inputs(DOWN, {**CFG, "a": {"x": 5, "y": 2}}, {"up": Upstream.of(up)}), down)
    assert changed.run and changed.reasons == ("config a.x 1 -> 5",)

    _run(UP, CFG, up, force=True)  # the same inputs, a new run: what consumed it is stale
    assert decide(stage_inputs(DOWN, CFG, {"up": Upstream.of(up)}), down).reasons == ("input up was rebuilt",)

    _run(UP, {**CFG, "a": {"x": 1, "y": 9}}, up)
    assert decide(stage_inputs(DOWN, CFG, {"up": Upstream.of(up)}), down).reasons == ("input up changed",)

    code = dataclasses.replace(current, code={**current.code, "peftbd/manifest.py": "edited"})
    assert decide(code, down).reasons == ("code changed: peftbd/manifest.py",)
    assert decide(current, down, force=True).reasons == ("forced",)


def test_the_manifest_records_the_contract_and_the_builds_sections(tmp_path):
    _run(UP, CFG, tmp_path / "up", text="hello")
    m = read_manifest(tmp_path / "up")
    assert m["stage"] == "up" and m["note"] == "hello" and m["config"] == CFG
    assert m["contract"]["config"] == {"a.x": 1, "a.y": 2}
    assert m["contract"]["fingerprint"] == stage_inputs(UP, CFG, {}).fingerprint
    assert len(m["contract"]["run_id"]) == 16 and m["wall_seconds"] >= 0 and "torch" in m["versions"]


def test_a_failed_build_publishes_nothing_and_keeps_the_old_output(tmp_path):
    out = tmp_path / "up"
    _run(UP, CFG, out, text="old")

    def boom(tmp: Path, _inputs) -> dict:
        (tmp / "out.txt").write_text("half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        run_stage(stage_inputs(UP, {**CFG, "a": {"x": 7}}, {}), out, boom, CFG)
    assert (out / "out.txt").read_text() == "old"
    assert read_manifest(out)["contract"]["config"] == {"a.x": 1, "a.y": 2}
    assert not is_complete(tmp_path / "up.partial")


def test_outputs_of_an_older_layout_are_never_taken_as_current(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "out.txt").write_text("x")
    write_manifest(old, {"stage": "up", "wall_seconds": 1.0})  # no contract
    with pytest.raises(StageError, match=r"older peftbd.*rm -r .*--force"):
        decide(stage_inputs(UP, CFG, {}), old)
    with pytest.raises(StageError, match="older peftbd"):
        Upstream.of(old)
    assert decide(stage_inputs(UP, CFG, {}), old, force=True).run  # --force rebuilds it


def test_a_missing_upstream_names_the_command_that_builds_it(tmp_path):
    with pytest.raises(StageError, match=r"no finished up artifact for down.*jobs.pipeline"):
        Upstream.of(tmp_path / "nowhere", UP, "down")
    with pytest.raises(StageError, match=r"jobs.down --out"):
        Upstream.of(tmp_path / "nowhere", DOWN)


def test_lineage_follows_what_each_artifact_was_built_from(tmp_path):
    up, down = tmp_path / "a" / "up", tmp_path / "b" / "down"
    _run(UP, CFG, up)
    _run(DOWN, CFG, down, {"up": Upstream.of(up)})
    assert lineage({"down": down}) == {"down": down, "up": up.resolve()}
    assert json.loads((down / "manifest.json").read_text())["contract"]["upstream"]["up"]["path"] == str(up.resolve())
