"""The figures draw every arm visibly, also arms whose points coincide."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from matplotlib.lines import Line2D

from peftbd.analysis.figures import acceptance_by_position, throughput_vs_accepted
from peftbd.benchmarking.schema import Results

SAME = {"draft_call_ms": 11.7, "accepted_per_position": [70, 45, 25, 12]}


@pytest.fixture
def coinciding(arm, results_of) -> Results:
    """1-step and anchored PEFT-BD at identical coordinates (and identical per-position rates)."""
    return results_of({
        "ar": arm("AR (greedy)", "ar", [144.0, 145.0], 1.0),
        "peftbd": arm("PEFT-BD 1 step", "peftbd", [118.4, 118.4], 2.53, **SAME),
        "peftbd_anchored": arm("PEFT-BD anchored", "peftbd", [118.4, 118.4], 2.53, **SAME),
        "fastmtp": arm("FastMTP", "fastmtp", [165.5, 165.0], 2.83, draft_call_ms=2.6,
                       accepted_per_position=[85, 62, 40]),
    })


def _markers(fig) -> dict[str, Line2D]:
    """{legend label: the Line2D carrying that arm's markers}."""
    ax = fig.axes[0]
    handles, labels = ax.get_legend_handles_labels()
    # an errorbar's handle is its container (a tuple): the data line comes first
    return {label: handle[0] if isinstance(handle, tuple) else handle
            for handle, label in zip(handles, labels)}


def _check_visible(lines: list[Line2D]) -> None:
    """Hollow, visible, distinct shapes, each smaller than and above every earlier one."""
    assert all(l.get_visible() and l.get_markersize() > 0 for l in lines)
    assert all(l.get_markerfacecolor() == "none" for l in lines)
    assert len({l.get_marker() for l in lines}) == len(lines)
    sizes, orders = [l.get_markersize() for l in lines], [l.get_zorder() for l in lines]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == len(sizes)
    assert orders == sorted(orders) and len(set(orders)) == len(orders)


def test_figure_1_draws_every_arm_even_on_the_same_point(coinciding) -> None:
    fig = throughput_vs_accepted(coinciding)
    lines = _markers(fig)
    arms = coinciding.arms.values()
    assert list(lines) == [a.label for a in arms]
    for a in arms:  # each arm's point is drawn where its numbers say
        line = lines[a.label]
        assert list(line.get_xdata()) == [a.mean_accepted.mean]
        assert list(line.get_ydata()) == [a.tokens_per_s.mean]
    _check_visible(list(lines.values()))
    texts = fig.axes[0].texts
    assert sorted(t.get_text() for t in texts) == sorted(a.label for a in arms)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(fig.bbox.x0 <= b.x0 and b.x1 <= fig.bbox.x1 for b in boxes)  # not cut off
    plt.close(fig)


def test_figure_2_draws_every_speculative_arm_and_gamma(coinciding) -> None:
    fig = acceptance_by_position(coinciding)
    lines = _markers(fig)
    gamma = lines.pop("gamma^j, training gamma = 0.9 (the loss's assumption)")
    assert list(gamma.get_ydata()) == pytest.approx([0.9, 0.81, 0.729, 0.6561])
    assert list(lines) == ["PEFT-BD 1 step", "PEFT-BD anchored", "FastMTP"]  # no AR
    assert list(lines["FastMTP"].get_ydata()) == [0.85, 0.62, 0.40]
    assert list(lines["PEFT-BD 1 step"].get_xdata()) == [1, 2, 3, 4]
    _check_visible(list(lines.values()))
    plt.close(fig)
