"""Arms timed in turns on the same prompts, so that load drift on a shared machine hits every
arm alike (the engine speed check and the peer table)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from peftbd.decoding.clock import Clock

T = TypeVar("T")


def interleaved_timing(arms: Mapping[str, Callable[[list[int]], T]], prompts: Sequence[list[int]],
                       repeats: int, clock: Clock) -> tuple[dict[str, list[T]], dict[str, list[list[float]]]]:
    """Per repeat, each prompt is decoded by every arm back to back (the arm order rotating per
    prompt). Returns per arm what it returned per prompt (last repeat) and seconds[repeat][prompt]."""
    names = list(arms)
    outputs: dict[str, list[T]] = {}
    seconds = {name: [[0.0] * len(prompts) for _ in range(repeats)] for name in names}
    for rep in range(repeats):
        outputs = {name: [] for name in names}
        for i, ids in enumerate(prompts):
            for j in range(len(names)):
                name = names[(i + j) % len(names)]
                start = clock.now()
                outputs[name].append(arms[name](ids))
                seconds[name][rep][i] = clock.now() - start
    return outputs, seconds
