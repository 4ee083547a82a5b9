"""The engine's one imitation of transformers' cache protocol (`CacheAdapter`), pinned to the
installed transformers, which must lie in the range pyproject.toml supports: a Qwen3 forward calls
exactly the members the adapter implements, and computes what it computes over a `DynamicCache`."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch
import transformers
from packaging.requirements import Requirement
from transformers import DynamicCache

from peftbd.decoding.cache_adapter import CacheAdapter
from peftbd.decoding.ragged import RaggedKV

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pyproject.toml declares tomli there (dev extra)
    import tomli as tomllib

PYPROJECT = Path(__file__).parents[3] / "pyproject.toml"

PROBED = frozenset({"is_compileable"})
"""What transformers' mask builder looks up with a default (`getattr(cache, name, False)`): the
adapter leaves it out, so the default holds."""


class Recording:
    """A `CacheAdapter` that notes every member transformers reads of it (`read`) and every one it
    looked up that the adapter lacks (`probed`)."""

    def __init__(self, inner: CacheAdapter) -> None:
        self.inner, self.read, self.probed = inner, set(), set()

    def __getattr__(self, name: str):
        if not hasattr(self.inner, name):
            self.probed.add(name)
            raise AttributeError(name)
        self.read.add(name)
        return getattr(self.inner, name)


def _forward(model, kv: RaggedKV, ids: torch.Tensor, valid: torch.Tensor | None, cache):
    """One chunk per row of `kv` through the verifier with `cache` (over `kv`); kept whole."""
    positions = torch.stack([torch.arange(n, n + ids.shape[1]) for n in kv.lengths])
    kv.open_chunk(valid, ids.shape[1])
    out = model.model(input_ids=ids, cache=cache, position_ids=positions,
                      attention_mask=kv.chunk_mask(None, model.dtype), use_cache=True)
    kv.commit([ids.shape[1]] * kv.size if valid is None else valid.sum(1).tolist())
    return out.last_hidden_state


def test_the_installed_transformers_is_a_supported_one_and_the_protocol_is_its_cache_s():
    declared = next(Requirement(r) for r in tomllib.loads(PYPROJECT.read_text())["project"]
                    ["dependencies"] if Requirement(r).name == "transformers")
    assert declared.specifier.contains(importlib.metadata.version("transformers")), declared
    assert CacheAdapter.PROTOCOL <= set(dir(transformers.Cache))  # imitated, not invented
    assert not isinstance(CacheAdapter(RaggedKV([0], torch.device("cpu"))), transformers.Cache)


def test_a_qwen3_forward_calls_exactly_the_adapters_members(verifier, prompts):
    """One row with the causal mask left to transformers (the batch-1 engine), then two rows
    with the engine's mask: together every member, and nothing else."""
    ids = torch.tensor([prompts[0][1][:12]])
    one = Recording(CacheAdapter(kv := RaggedKV([0], ids.device)))
    _forward(verifier, kv, ids, None, one)
    _forward(verifier, kv, ids[:, :3], None, one)  # a second chunk after committed slots
    two = Recording(CacheAdapter(kv := RaggedKV([0, 0], ids.device)))
    _forward(verifier, kv, ids.repeat(2, 1), torch.tensor([[True] * 12, [True] * 7 + [False] * 5]),
             two)
    assert one.read | two.read == CacheAdapter.PROTOCOL
    assert two.read == {"update"}  # a given 4D mask: transformers sizes nothing
    assert one.probed | two.probed <= PROBED


def test_a_forward_through_the_adapter_equals_a_dynamic_cache_forward(verifier, prompts):
    """Per row, prompt then a continuation chunk: the same hidden states as transformers' own
    cache (one row bit for bit; two padded rows to float tolerance)."""
    a, b = prompts[0][1][:14], prompts[1][1][:9]
    want = []
    for row in (a, b):
        cache = DynamicCache(config=verifier.config)
        first = verifier.model(input_ids=torch.tensor([row[:-3]]), cache=cache, use_cache=True)
        then = verifier.model(input_ids=torch.tensor([row[-3:]]), cache=cache, use_cache=True,
                              position_ids=torch.arange(len(row) - 3, len(row)).unsqueeze(0))
        want.append(torch.cat([first.last_hidden_state, then.last_hidden_state], 1))
    kv = RaggedKV([0], torch.device("cpu"))
    one = [_forward(verifier, kv, torch.tensor([a[:-3]]), None, CacheAdapter(kv)),
           _forward(verifier, kv, torch.tensor([a[-3:]]), None, CacheAdapter(kv))]
    assert torch.equal(torch.cat(one, 1), want[0])
    kv = RaggedKV([0, 0], torch.device("cpu"))
    firsts = torch.tensor([a[:-3], b[:-3] + [0] * (len(a) - len(b))])
    valid = torch.arange(len(a) - 3) < torch.tensor([[len(a) - 3], [len(b) - 3]])
    h1 = _forward(verifier, kv, firsts, valid, CacheAdapter(kv))
    h2 = _forward(verifier, kv, torch.tensor([a[-3:], b[-3:]]), None, CacheAdapter(kv))
    for i, (row, ref) in enumerate(zip((a, b), want)):
        got = torch.cat([h1[i, : len(row) - 3], h2[i]], 0).unsqueeze(0)
        assert torch.allclose(got, ref, atol=1e-5), i
