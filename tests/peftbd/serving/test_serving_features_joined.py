"""Two replies' shipped blocks joined for a drafter that took neither (a round drafted ahead
skipped its propose): the same bytes as one block of both, only when they are contiguous and of
one kind."""

from __future__ import annotations

import torch

from peftbd.serving.features import FINAL_HIDDEN, FeatureBlock, KVBlock, joined


def _kv(start: int, n: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], KVBlock]:
    torch.manual_seed(start)
    kv = [(torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)) for _ in range(3)]
    return kv, KVBlock.encode(kv, start)


def test_contiguous_kv_blocks_join_into_one_block_of_both():
    (a, first), (b, second) = _kv(5, 2), _kv(7, 3)
    both = joined(first, second)
    assert both == KVBlock.encode([(torch.cat([ka, kb], 2), torch.cat([va, vb], 2))
                                   for (ka, va), (kb, vb) in zip(a, b)], 5)
    assert both is not None and both.covers(5, 10)


def test_feature_blocks_join_and_anything_else_keeps_the_later_block():
    x, y = torch.randn(1, 2, 6), torch.randn(1, 1, 6)
    f1, f2 = FeatureBlock.encode(x, FINAL_HIDDEN, 3), FeatureBlock.encode(y, FINAL_HIDDEN, 5)
    assert joined(f1, f2) == FeatureBlock.encode(torch.cat([x, y], 1), FINAL_HIDDEN, 3)
    _, gap = _kv(8, 1)
    _, first = _kv(5, 2)
    assert joined(first, gap) is gap and joined(None, gap) is gap and joined(first, None) is None
    assert joined(f1, _kv(5, 1)[1]).start == 5  # of two kinds: the later
    other = FeatureBlock.encode(y, (1, 2), 5)
    assert joined(f1, other) is other  # features of other layers
