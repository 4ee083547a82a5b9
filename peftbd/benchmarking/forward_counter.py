"""What one forward call needs from memory and compute, counted at the aten level.

`ForwardCounter` is a `TorchDispatchMode` that, per forward call (`ForwardLog.observer`), counts:

- FLOPs of every matmul: `aten.linear` (which inference mode dispatches whole: 2 per
  multiply-add), the ops of torch's own `flop_registry`, and attention (any
  `*scaled_dot_product*` op, which the registry lacks on CPU: 4·B·H·Lq·Lk·D);
- the elements it must read: each storage an op reads that was not produced inside this forward,
  once (weights, the KV cache, the LM head), except an embedding lookup, which reads only the rows
  it returns; `bytes_at(2)` is that at bf16, the basis of a roofline bound;
- the largest tensor any op produced (`largest_output`): a drafter that copies a vocabulary-sized
  matrix per forward (peft's trainable-token wrappers do) shows it there.

Counting runs every op through Python: use it for one untimed round, never while timing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

_EMBEDDING = torch.ops.aten.embedding.default
_LINEAR = torch.ops.aten.linear.default


@dataclass
class ForwardCount:
    """One forward call: its mode, FLOPs, elements read from memory, largest tensor produced."""

    mode: str
    flops: int = 0
    elements_read: int = 0
    largest_output: int = 0
    largest_output_op: str = ""

    def bytes_at(self, bytes_per_element: int) -> int:
        """Bytes this forward reads when stored at `bytes_per_element` (2 for bf16)."""
        return self.elements_read * bytes_per_element


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _attention_flops(args: tuple[Any, ...]) -> int:
    q, k = args[0], args[1]  # (B, H, Lq, D), (B, Hkv, Lk, D)
    b, h, lq, d = q.shape
    return 4 * b * h * lq * k.shape[-2] * d


class ForwardCounter(TorchDispatchMode):
    """Counts every forward call it observes; `forwards` lists them in call order."""

    def __init__(self) -> None:
        super().__init__()
        self.forwards: list[ForwardCount] = []
        self._current: ForwardCount | None = None
        self._read: set[int] = set()
        self._produced: set[int] = set()

    @contextlib.contextmanager
    def forward(self, mode: str) -> Iterator[None]:
        """Count the ops of one forward call of `mode` (the `ForwardLog.observer` hook)."""
        self._current, self._read, self._produced = ForwardCount(mode), set(), set()
        with self:
            yield
        self.forwards.append(self._current)
        self._current = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's hook)
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = self._current
        if count is None:
            return out
        packet = func.overloadpacket
        if func is _LINEAR:
            count.flops += 2 * out.numel() * args[1].shape[-1]
        elif packet in flop_registry:
            count.flops += int(flop_registry[packet](*args, **kwargs, out_val=out))
        elif "scaled_dot_product" in packet.__name__:
            count.flops += _attention_flops(args)
        inputs = [] if func is _EMBEDDING else tree_leaves((args, kwargs))
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                key = _storage_key(t)
                if key not in self._read and key not in self._produced:
                    self._read.add(key)
                    count.elements_read += t.untyped_storage().nbytes() // t.element_size()
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._produced.add(_storage_key(t))
                if func is _EMBEDDING:
                    count.elements_read += t.numel()  # the rows looked up
                if t.numel() > count.largest_output:
                    count.largest_output, count.largest_output_op = t.numel(), str(packet)
        return out


@dataclass
class RoundCount:
    """The forwards of one round, split by phase (`draft` vs the verify/AR forward)."""

    draft: list[ForwardCount] = field(default_factory=list)
    verify: list[ForwardCount] = field(default_factory=list)

    @classmethod
    def of(cls, forwards: list[ForwardCount]) -> RoundCount:
        return cls(draft=[f for f in forwards if f.mode == "draft"],
                   verify=[f for f in forwards if f.mode == "verify"])
