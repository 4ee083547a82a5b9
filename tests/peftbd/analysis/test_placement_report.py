"""placement.json as its model (`PlacementReport`): written, then read back as the same report;
its text is what the job wrote as hand-built dicts before (same keys, same layout), so such a
file reads too; the manifest's placement sections (`PlacementSections`) likewise."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from peftbd.analysis.placement import (
    Devices,
    RequestRecord,
    Window,
    concurrency_summary,
    one_at_a_time,
    outputs_identical,
    summarize,
)
from peftbd.analysis.placement_verdict import (
    PlacementReport,
    PlacementSections,
    sentence,
    verdicts,
)
from peftbd.serving.schemas import SpecStats

DEVICES = {"colocated": Devices(2, 2), "split": Devices(2, 1)}


@pytest.fixture
def report() -> PlacementReport:
    """A report of random measurements: two placements x three methods x three concurrencies."""
    rng = random.Random(7)
    records, windows = [], []
    for placement in DEVICES:
        roles = ("engine",) if placement == "colocated" else ("drafter", "verifier")
        for method in ("ar", "peftbd [synthetic: 3/round]", "fastmtp"):
            for clients in (1, 2, 4):
                for prompt in range(3):
                    spec = SpecStats(
                        method=method, synthetic=3.0 if "synthetic" in method else None,
                        rounds=rng.randint(1, 9), proposed_tokens=rng.randint(0, 20),
                        accepted_tokens=rng.randint(0, 9), prefill_ms=rng.random() * 5,
                        draft_ms=rng.random() * 9, verify_ms=rng.random() * 9 + 1,
                        sync_ms=rng.random(), other_ms=rng.random(),
                        transport_ms=rng.random() * 3, feature_bytes=rng.randint(0, 999),
                        mean_batch_size=1 + rng.random() * 3)
                    start = rng.random()
                    records.append(RequestRecord(placement, method, prompt, f"text {prompt}",
                                                 rng.randint(2, 16), 1 + rng.random() * 100,
                                                 spec, clients, start, start + rng.random()))
                windows.append(Window(placement, method, clients,
                                      {r: [rng.random(), rng.random()] for r in roles}))
    summary = summarize(one_at_a_time(records))
    rows = concurrency_summary(records, windows, DEVICES)
    found = verdicts(summary, rows, DEVICES, 0.5)
    assert found
    return PlacementReport(summary=summary, concurrency=rows, skipped={"split-cross-node": "why"},
                           notes=["a note"], devices=DEVICES, verdicts=found,
                           outputs_identical=outputs_identical(records), requests=records)


def _hand_built(r: PlacementReport) -> dict:
    """placement.json as the job built it by hand before the model (its keys, in order)."""
    return {"summary": {p: {m: dataclasses.asdict(run) for m, run in runs.items()}
                        for p, runs in r.summary.items()},
            "concurrency": [dataclasses.asdict(row) for row in r.concurrency],
            "skipped": r.skipped, "notes": r.notes,
            "devices": {p: dataclasses.asdict(d) for p, d in r.devices.items()},
            "verdicts": [dataclasses.asdict(v) for v in r.verdicts],
            "outputs_identical": r.outputs_identical,
            "requests": [{**dataclasses.asdict(x), "spec": x.spec.model_dump()} for x in r.requests]}


def test_placement_json_written_then_read_is_the_same_report(report, tmp_path):
    path = report.write(tmp_path)
    assert path == tmp_path / "placement.json"
    back = PlacementReport.read(path)
    assert back == report and PlacementReport.read(tmp_path) == report  # the file or its dir
    assert type(back.requests[0].spec) is SpecStats and back.verdicts[0].capacity == \
        report.verdicts[0].capacity
    assert [sentence(v) for v in back.verdicts] == [sentence(v) for v in report.verdicts]


def test_placement_json_keeps_its_keys_and_layout_and_an_older_file_reads(report, tmp_path):
    legacy = json.dumps(_hand_built(report), indent=2)
    # the hand-built keys in their order, then drafting ahead's verdicts (none here)
    assert report.to_json() == json.dumps({**_hand_built(report), "ahead": []}, indent=2)
    (tmp_path / "placement.json").write_text(legacy)  # a file from before drafting ahead
    assert PlacementReport.read(tmp_path / "placement.json") == report


def test_a_placement_json_of_another_shape_is_refused_naming_the_field(report, tmp_path):
    broken = _hand_built(report)
    del broken["devices"]
    (tmp_path / "placement.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="devices"):
        PlacementReport.read(tmp_path)


def test_the_manifest_sections_read_back_typed():
    sections = PlacementSections(counts={"prompts": 2, "requests": 8},
                                 placements=["colocated", "split"], skipped={"x": "why"},
                                 outputs_identical=True, verdicts=["a sentence"])
    manifest = {"stage": "placement", "wall_s": 3.0, **sections.to_sections()}
    assert list(sections.to_sections()) == [
        "counts", "placements", "skipped", "outputs_identical", "verdicts"]
    assert PlacementSections.from_manifest(json.loads(json.dumps(manifest))) == sections
    assert PlacementSections.from_manifest({"placements": ["colocated"]}).verdicts == []
