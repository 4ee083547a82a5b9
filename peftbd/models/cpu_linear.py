"""Linears on oneDNN prepacked weights, for decoding on a CPU (what vLLM's CPU backend runs).

PyTorch's eager `F.linear` on a CPU hands a few-row GEMM to a BLAS that packs the weight on
every call: at Qwen3-0.6B's shape (one thread) a 1024 x 3072 fp32 linear took 0.28 ms for one
row and 1.73 ms for four, and in bf16 0.38 / 0.46 ms. With the weight reordered once into
oneDNN's blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, the op inductor's
weight-prepack pass emits) the same linears took 0.41 / 0.50 ms in fp32 and 0.17 / 0.23 ms in
bf16. So `prepack_linears(model)` gives each large `nn.Linear` a forward that runs the packed
weight where it is faster (bf16 always, fp32 from two rows) and `F.linear` elsewhere.

The packed copy is made on first use and again whenever the weight changed (its storage or its
version counter: an optimizer step, a load), so a model that trains between decodes stays exact.
It is used only for inference (no autograd through it), and not under a dispatch mode (the
forward counter counts `aten.linear`). Inside a `torch.compile`d graph (the fast path) the linear
is the opaque custom op `peftbd::packed_linear`, so inductor calls the same packed GEMM instead of
its own `aten.mm` on the unpacked weight (as slow for a few rows as eager `F.linear`), and the
weights stay live (no freezing: a weight that changed is packed again). It keeps the original weight: the model's weights take twice the memory.
"""

from __future__ import annotations

import types

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import _get_current_dispatch_mode
from torch.utils.weak import WeakIdKeyDictionary

MIN_WEIGHTS = 1 << 16
"""Smaller linears (a LoRA's A and B, the tiny world's) keep `F.linear`: nothing to gain."""


def prepack_available(dtype: torch.dtype) -> bool:
    """Whether this CPU build runs oneDNN linears of `dtype` (bf16: with AVX-512 BF16 or AMX)."""
    if not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype == torch.float32


def prepack_linears(model: nn.Module) -> int:
    """Give `model`'s large CPU `nn.Linear`s the prepacked forward (see module doc); returns how
    many. Idempotent."""
    count = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (type(module) is nn.Linear and isinstance(weight, torch.Tensor)
                and weight.device.type == "cpu" and weight.numel() >= MIN_WEIGHTS
                and prepack_available(weight.dtype)):
            vars(module)["forward"] = types.MethodType(packed_forward, module)
            count += 1
    return count


def packed_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, self.weight, self.bias)`, on the prepacked weight where it pays (inside a
    compiled graph: always, as the opaque `peftbd::packed_linear`)."""
    weight = self.weight
    usable = x.dtype == weight.dtype and weight.dim() == 2 and not (
        torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))
    if torch.compiler.is_compiling():  # (a dispatch mode's check would break the graph)
        return packed_linear(x, weight, self.bias) if usable else F.linear(x, weight, self.bias)
    if (not usable or _get_current_dispatch_mode() is not None
            or (x.dtype == torch.float32 and x.numel() < 2 * x.shape[-1])):
        return F.linear(x, weight, self.bias)
    return torch.ops.mkldnn._linear_pointwise(x, _packed(weight), self.bias, "none", [], "")


@torch.library.custom_op("peftbd::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear` on `weight`'s prepacked copy: an opaque call in a compiled graph, so inductor
    runs oneDNN's packed GEMM (without freezing the weights: they may change between calls)."""
    return torch.ops.mkldnn._linear_pointwise(x, _packed(weight), bias, "none", [], "")


@packed_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


_HELD: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""weight -> (its key when packed, the packed copy); an entry goes with its weight."""


def _packed(weight: torch.Tensor) -> torch.Tensor:
    """`weight` in oneDNN's layout, reordered again when it changed (storage or version)."""
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor keeps no version counter: it is never updated
        version = 0
    key = (weight.data_ptr(), version, weight.dtype, tuple(weight.shape))
    held = _HELD.get(weight)
    if held is None or held[0] != key:
        with torch.no_grad():
            held = (key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
        _HELD[weight] = held
    return held[1]
