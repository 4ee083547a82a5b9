"""Length-grouped micro-batches: the same rows, the same batch sizes, less padding, an order
that depends on the rows and the seed alone."""

from itertools import islice

import numpy as np

from peftbd.training.length_groups import length_grouped


def _batches(lengths: list[int], size: int) -> list[dict]:
    out = []
    for at in range(0, len(lengths), size):
        n = lengths[at : at + size]
        out.append({
            "id": np.array([f"r{at + i}" for i in range(len(n))]),
            "prompt_ids": np.array([np.arange(k // 2) for k in n] + [None], dtype=object)[:-1],
            "continuation_ids": np.array([np.arange(k - k // 2) for k in n] + [None], dtype=object)[:-1],
            "prompt_len": np.array([k // 2 for k in n]),
            "continuation_len": np.array([k - k // 2 for k in n]),
        })
    return out


def _padded(batches) -> int:
    return sum(len(b["id"]) * max(b["prompt_len"] + b["continuation_len"]) for b in batches)


def test_the_same_rows_in_batches_of_the_same_sizes_with_less_padding():
    lengths = list(np.random.default_rng(0).integers(20, 400, size=70))
    plain = _batches(lengths, 4)
    grouped = list(length_grouped(iter(plain), 8, seed=0))
    assert sorted(len(b["id"]) for b in grouped) == sorted(len(b["id"]) for b in plain)
    assert sorted(x for b in grouped for x in b["id"]) == sorted(x for b in plain for x in b["id"])
    for b in grouped:  # each row keeps its own tokens and lengths
        for i, row in enumerate(b["id"]):
            k = lengths[int(row[1:])]
            assert len(b["prompt_ids"][i]) + len(b["continuation_ids"][i]) == k
            assert b["prompt_len"][i] + b["continuation_len"][i] == k
    assert _padded(grouped) < 0.85 * _padded(plain)


def test_the_order_is_a_function_of_the_rows_and_the_seed_so_a_resume_skips_exactly():
    plain = _batches(list(np.random.default_rng(1).integers(5, 90, size=40)), 4)
    first = [list(b["id"]) for b in length_grouped(iter(plain), 4, seed=3)]
    again = [list(b["id"]) for b in length_grouped(iter(plain), 4, seed=3)]
    assert first == again
    assert first != [list(b["id"]) for b in length_grouped(iter(plain), 4, seed=4)]
    resumed = [list(b["id"]) for b in islice(length_grouped(iter(plain), 4, seed=3), 3, None)]
    assert resumed == first[3:]


def test_a_window_of_one_or_zero_keeps_the_order():
    plain = _batches([5, 9, 3, 7, 2, 8], 2)
    for window in (0, 1):
        assert [list(b["id"]) for b in length_grouped(iter(plain), window, 0)] == \
            [list(b["id"]) for b in plain]
