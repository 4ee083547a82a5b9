"""The graph audit (`peftbd.decoding.graph_audit`) tells a graph that writes a non-static input
(CUDA-graph trees would skip it) from one that writes a buffer marked static: the check the
fast path's tests rely on can fail."""

from __future__ import annotations

import pytest
import torch

from peftbd.decoding.graph_audit import audit


def _write(buffer: torch.Tensor, rows: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    buffer.index_put_((rows,), value)
    return buffer[: rows.shape[0]].sum()


@pytest.mark.slow  # two small compiles
@pytest.mark.parametrize("static", [False, True])
def test_a_write_to_a_non_static_input_is_caught(static):
    torch._dynamo.reset()
    buffer = torch.zeros(8, 4)
    if static:
        torch._dynamo.mark_static_address(buffer)
    with audit() as graphs:
        torch.compile(_write, dynamic=True)(buffer, torch.arange(3), torch.ones(3, 4))
    assert len(graphs.graphs) == 1 and graphs.graphs[0].mutated
    assert bool(graphs.skipped) is not static
