"""The report follows the registry (`peftbd.methods`): a newly registered method's arms appear in
every per-arm table and figure with no edit to the analysis code, an arm's training estimate is
its own stage's, and the head's goals cover the head method's own arms."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator

import matplotlib.pyplot as plt
import pytest

from peftbd.analysis import tables
from peftbd.analysis.acceptance import position_table
from peftbd.analysis.figures import throughput_vs_accepted
from peftbd.analysis.head_goals import head_arms
from peftbd.analysis.readme_table import render
from peftbd.benchmarking.schema import Arm, DrafterInfo
from peftbd.methods.fastmtp import TRAIN_MTP
from peftbd.methods.peft_bd import TRAIN_EARLY_EXIT, TRAIN_PEFTBD
from peftbd.layout import training_stage
from peftbd.methods import Former, Method, method, register, unregister
from peftbd.methods.fastmtp import ID as FASTMTP


@pytest.fixture
def toy() -> Iterator[Method]:
    """FastMTP's declaration under a new name and training stage, registered for one test."""
    stage = training_stage("toy", "train toy head")
    toy = register(dataclasses.replace(method(FASTMTP), id="toy", label="Toy", what="toy head",
                                       stages=(stage,), former=Former()))
    try:
        yield toy
    finally:
        unregister(toy.id)


def test_a_registered_methods_arms_appear_in_every_per_arm_table_and_figure(
        toy, arm, sample_results) -> None:
    results = copy.deepcopy(sample_results)
    results.arms["toy"] = Arm.model_validate(arm("Toy narrow", "toy", [150.0, 151.0], 1.6,
                                                 draft_call_ms=0.3, accepted_per_position=[50, 10]))
    results.arms["toy_wide"] = Arm.model_validate(arm("Toy wide", "toy", [90.0, 91.0], 1.9,
                                                      draft_call_ms=0.9,
                                                      accepted_per_position=[60, 30]))
    results.drafters = {"toy": DrafterInfo(path="/a/toy",
                                                metrics={"eval_accepted_prefix_mean": 0.45})}
    assert [a for a, _ in results.arm_items()] == ["ar", "peftbd", "fastmtp", "toy", "toy_wide"]
    for text in (tables.forward_table(results), tables.acceptance_table(results),
                 tables.repeats_table(results), tables.oracle_table(results),
                 position_table(results), render(results)):
        assert "| Toy narrow |" in text and "| Toy wide |" in text
    # its stage's training estimate sits beside its first arm only (no replay here)
    offline = tables.offline_table(results)
    assert "| Toy narrow | 0.60 | n/a | n/a | n/a | 0.45 | n/a |" in offline
    assert "Toy wide" not in offline
    fig = throughput_vs_accepted(results)
    assert {"Toy narrow", "Toy wide"} <= set(fig.axes[0].get_legend_handles_labels()[1])
    plt.close(fig)


def test_an_arms_training_estimate_is_its_own_stages(arm, results_of) -> None:
    """The first arm drafting from each stage's output gets that stage's estimate; an arm whose
    stage results.json does not record (older results) drafts from its method's main stage."""
    drafting = {"peftbd": ("peftbd", TRAIN_PEFTBD), "peftbd_2step": ("peftbd", TRAIN_PEFTBD),
                "peftbd_early_exit": ("peftbd", TRAIN_EARLY_EXIT), "fastmtp": ("fastmtp", TRAIN_MTP)}
    results = results_of({"ar": arm("AR", "ar", [400.0], 1.0), **{
        arm_id: {**arm(arm_id, m, [100.0], 1.5), "stage": stage.name}
        for arm_id, (m, stage) in drafting.items()}})
    results.drafters = {s.subdir: DrafterInfo(path=f"/a/{s.subdir}",
                                              metrics={"eval_accepted_prefix_mean": v})
                        for s, v in ((TRAIN_PEFTBD, 0.5), (TRAIN_EARLY_EXIT, 0.3), (TRAIN_MTP, 0.7))}
    assert tables.training_estimates(results) == {"peftbd": 0.5, "peftbd_early_exit": 0.3,
                                                  "fastmtp": 0.7}
    for entry in results.arms.values():
        entry.stage = None
    assert tables.training_estimates(results) == {"peftbd": 0.5, "fastmtp": 0.7}


def test_the_head_goals_cover_the_head_methods_own_arms(arm, results_of) -> None:
    synthetic = {**arm("BD head [synthetic]", "peftbd_head", [200.0], 5.2),
                 "settings": {"synthetic": 5.3}}
    results = results_of({
        "ar": arm("AR", "ar", [400.0], 1.0), "peftbd": arm("PEFT-BD", "peftbd", [120.0], 1.4),
        "peftbd_head": arm("BD head", "peftbd_head", [140.0], 2.2),
        "peftbd_head_vocab": arm("BD head, top-512", "peftbd_head", [150.0], 2.1),
        "peftbd_head_synthetic": synthetic,
    })
    assert head_arms(results) == ["peftbd_head", "peftbd_head_vocab"]
