"""`flat`: projections see 2D rows (the CPU bf16 cliff of 3D strided inputs), same values."""

from __future__ import annotations

import torch

from peftbd.models.flat import flat


def test_flat_folds_leading_dims_and_keeps_values():
    weight = torch.randn(11, 8)
    hidden = torch.randn(2, 17, 8)[:, 1:]  # a draft block's positions: a strided 3D slice
    seen = []

    def project(x):
        seen.append(x.dim())
        return torch.nn.functional.linear(x, weight)

    out = flat(project, hidden)
    assert seen == [2] and out.shape == (2, 16, 11)
    torch.testing.assert_close(out, torch.nn.functional.linear(hidden, weight))
