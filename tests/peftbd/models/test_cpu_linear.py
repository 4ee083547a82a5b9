"""Prepacked CPU linears (`peftbd.models.cpu_linear`): the same outputs as `F.linear`, a weight
that changed is packed again, and autograd never goes through the packed op."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from peftbd.models.cpu_linear import prepack_available, prepack_linears

DTYPES = [d for d in (torch.float32, torch.bfloat16) if prepack_available(d)]


@pytest.mark.skipif(not DTYPES, reason="this torch build has no oneDNN linears")
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prepacked_linear_computes_f_linear_and_follows_its_weight(dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 384), nn.Linear(8, 8)).to(dtype)
    big = model[0]
    assert prepack_linears(model) == 1 and prepack_linears(model) == 1  # the large one; idempotent
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 5e-2}
    with torch.inference_mode():
        for rows in (1, 4, 17):
            x = torch.randn(2, rows, 512, dtype=dtype)
            torch.testing.assert_close(big(x), F.linear(x, big.weight, big.bias), **tol)
    with torch.no_grad():
        big.weight.add_(1.0)  # an optimizer step: the packed copy is stale
    with torch.inference_mode():
        x = torch.randn(4, 512, dtype=dtype)
        torch.testing.assert_close(big(x), F.linear(x, big.weight, big.bias), **tol)
    x = torch.randn(4, 512, dtype=dtype, requires_grad=True)
    big(x).sum().backward()  # training: plain F.linear, gradients flow
    assert x.grad is not None and big.weight.grad is not None


@pytest.mark.slow  # a compile
@pytest.mark.skipif(torch.bfloat16 not in DTYPES, reason="this CPU runs no oneDNN bf16 linears")
def test_a_compiled_graph_runs_the_packed_linear_and_sees_a_changed_weight():
    torch.manual_seed(0)
    big = nn.Linear(512, 384).to(torch.bfloat16)
    prepack_linears(big)
    compiled = torch.compile(lambda x: torch.relu(big(x)), dynamic=False)
    tol = {"rtol": 2e-2, "atol": 5e-2}
    with torch.inference_mode():
        x = torch.randn(1, 512, dtype=torch.bfloat16)
        torch.testing.assert_close(compiled(x), torch.relu(F.linear(x, big.weight, big.bias)), **tol)
        with torch.profiler.profile() as prof:
            compiled(x)
        assert any(e.key == "peftbd::packed_linear" for e in prof.key_averages())  # not aten::mm
    with torch.no_grad():
        big.weight.mul_(-1.0)  # the weights change between calls: the graph holds no copy
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), torch.relu(F.linear(x, big.weight, big.bias)), **tol)
