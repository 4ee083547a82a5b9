"""Length-grouped micro-batches (transformers' `group_by_length`, megabatches as its
`LengthGroupedSampler` cuts them): a micro-batch is right-padded to its longest sequence, so rows
of mixed lengths waste compute on padding (the tiny world's train split in hash order: 0.68 of
the padded tokens are real; sorted in windows of 8 micro-batches: 0.92).

`length_grouped` reads a worker's micro-batches in windows of `window`, sorts each window's rows
by sequence length, cuts it into micro-batches of the same sizes again and yields them in a
seeded order (the same on every worker: at a step, each worker's micro-batch comes from the same
quantile of its window, so the data-parallel workers finish a step at about the same time). The
order is a function of the pass's rows and the seed alone, so a resumed run that skips the
micro-batches it consumed lands on the same batches.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import count, islice
from typing import Any

import numpy as np

from peftbd.training.schedule import Rows


def length_grouped(micro_batches: Iterable[Rows], window: int, seed: int) -> Iterator[Rows]:
    """`micro_batches` regrouped by length (see module doc); `window` 0 or 1: as they come."""
    if window <= 1:
        yield from micro_batches
        return
    batches = iter(micro_batches)
    for index in count():
        group = list(islice(batches, window))
        if not group:
            return
        sizes = [len(b["id"]) for b in group]
        rows = {k: _concat([b[k] for b in group]) for k in group[0]}
        order = np.argsort(np.asarray(rows["prompt_len"]) + np.asarray(rows["continuation_len"]),
                           kind="stable")
        cuts = np.split(order, np.cumsum(sizes)[:-1])
        for i in np.random.default_rng([seed, index]).permutation(len(cuts)):
            yield {k: v[cuts[i]] for k, v in rows.items()}


def _concat(columns: list[Any]) -> np.ndarray:
    """One column of several micro-batches; ragged token lists (object arrays, or 2-D where a
    batch's lists happen to be equally long) become one object array of arrays."""
    arrays = [np.asarray(c) for c in columns]
    if all(a.dtype != object and a.ndim == 1 for a in arrays):
        return np.concatenate(arrays)
    items = [x for a in arrays for x in a]
    out = np.empty(len(items), dtype=object)
    for j, x in enumerate(items):
        out[j] = x
    return out
