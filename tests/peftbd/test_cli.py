"""What a stage job says before any work when it replaces an existing output (no Ray)."""

from __future__ import annotations

from pathlib import Path

from peftbd.cli import plan_line
from peftbd.stage import StageSpec, decide, run_stage, stage_inputs

SPEC = StageSpec("train_peftbd", "PEFT-BD adapter", "peftbd", reads=("peftbd",))


def _build(tmp: Path, _inputs) -> dict:
    (tmp / "adapter.bin").write_text("weights")
    return {}


def test_a_changed_setting_on_an_existing_output_is_named_before_any_work(tmp_path):
    out = tmp_path / "peftbd"
    first = stage_inputs(SPEC, {"peftbd": {"lora_r": 16}}, {})
    assert plan_line(SPEC, out, decide(first, out)) is None  # nothing there yet
    run_stage(first, out, _build, {})
    assert plan_line(SPEC, out, decide(first, out)) is None  # current: skipped
    changed = stage_inputs(SPEC, {"peftbd": {"lora_r": 8}}, {})
    assert plan_line(SPEC, out, decide(changed, out)) == (
        f"train_peftbd: rebuilding {out} (config peftbd.lora_r 16 -> 8); the output there stays "
        f"until the new one is complete (to keep both, pass another --out)")
