"""The figures draw every arm visibly, also arms whose points coincide, and no title, label or
legend collides with another or hides the data."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pytest
from matplotlib.lines import Line2D
from matplotlib.transforms import Bbox

from peftbd.analysis.figures import (
    acceptance_by_position,
    speedup_vs_accepted,
    throughput_vs_accepted,
    throughput_vs_batch,
)
from peftbd.benchmarking.schema import ConcurrencyRow, Results

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


LONG_HARDWARE = "CPU Intel(R) Xeon(R) Processor (2 cores, torch threads: 2)"


@pytest.fixture
def crowded(sample_results, cost_profile_of) -> Results:
    """The sample run on long-named hardware with a batch sweep and a cost profile (Figure 4's
    panels: this run, one round at scale, the roofline), so every figure has long titles."""
    rows = [ConcurrencyRow(a, b, 100.0 * b, 2.0, True, 1.0 if a == "ar" else 0.5, 4.0)
            for a in sample_results.arms for b in (1, 4, 16)]
    profile = cost_profile_of({"ar": (0.0, 100.0), "peftbd": (100.0, 100.0),
                               "fastmtp": (30.0, 100.0)})
    profile.hardware = LONG_HARDWARE
    results = sample_results.model_copy(update={"concurrency": rows, "cost_at_scale": profile})
    results.measured_on.hardware = LONG_HARDWARE
    return results


def _text_boxes(fig) -> list[Bbox]:
    """The display boxes of the figure's title, every axes title and axis label and every legend,
    after the layout."""
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    texts = [fig._suptitle] if fig._suptitle is not None else []
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label]
    boxes = [t.get_window_extent(renderer) for t in texts if t.get_text()]
    return boxes + [legend.get_window_extent(renderer) for legend in _legends(fig)]


def _legends(fig) -> list:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


@pytest.mark.parametrize("draw", [throughput_vs_accepted, acceptance_by_position,
                                  throughput_vs_batch, speedup_vs_accepted])
def test_no_title_label_or_legend_collides_or_hides_data(crowded, draw) -> None:
    fig = draw(crowded)
    boxes = _text_boxes(fig)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert all(fig.bbox.x0 <= b.x0 and b.x1 <= fig.bbox.x1 and fig.bbox.y0 <= b.y0
               and b.y1 <= fig.bbox.y1 for b in boxes)  # nothing cut off
    renderer = fig.canvas.get_renderer()
    for legend in _legends(fig):  # outside every axes: it hides no data
        assert not any(legend.get_window_extent(renderer).overlaps(ax.bbox) for ax in fig.axes)
    plt.close(fig)


def test_figure_4_wraps_long_panel_titles_apart(crowded) -> None:
    fig = speedup_vs_accepted(crowded)
    assert len(fig.axes) == 3 and any("\n" in ax.get_title() for ax in fig.axes)
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    titles = [ax.title.get_window_extent(renderer) for ax in fig.axes]
    assert not any(a.overlaps(b) for i, a in enumerate(titles) for b in titles[i + 1:])
    assert all(t.x0 >= ax.bbox.x0 - 30 and t.x1 <= ax.bbox.x1 + 30  # over its own panel
               for t, ax in zip(titles, fig.axes))
    plt.close(fig)
