"""LoRA's adapter-on forward as plain matmuls, for drafting (inference).

peft's `lora.Linear.forward` runs `W x + B(A(dropout(x))) * s` through three module calls and
per-call bookkeeping (argument checks, adapter lookups, dtype casts): about 85 us a layer on this
CPU against 22 us for the two extra matmuls themselves, which on the 1.5M-parameter tiny verifier
(14 LoRA layers) made a draft forward ~1.2 ms dearer than a verify forward for no compute at all.
`lean_lora(model)` swaps each adapted Linear's forward for the same operations in the same order
(`base(x) + F.linear(F.linear(x, A), B) * s` per active adapter), so drafts are
bit-identical to peft's, while a block runs. Layers peft must run itself (dropout > 0, DoRA or
another variant, a non-Linear base) keep peft's forward. Training never uses it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from peft import PeftModel
from peft.tuners.lora.layer import Linear as LoraLinear
from torch import nn
from torch.nn import functional as F

_CACHE = "_peftbd_lean_lora"
Forward = Callable[[torch.Tensor], torch.Tensor]


def _lean_forward(layer: LoraLinear) -> Forward | None:
    """`layer`'s adapter-on forward for its active adapters, or None where peft's is needed."""
    base = layer.base_layer
    if not isinstance(base, nn.Linear) or layer.merged:
        return None
    parts = []
    for name in layer.active_adapters:
        if name not in layer.lora_A:
            continue
        if (name in layer.lora_variant or layer.use_dora.get(name)
                or not isinstance(layer.lora_dropout[name], nn.Identity)
                or layer.lora_A[name].weight.dtype != base.weight.dtype):
            return None
        parts.append((layer.lora_A[name].weight, layer.lora_B[name].weight, layer.scaling[name]))
    def forward(x: torch.Tensor) -> torch.Tensor:
        out = base.forward(x)  # F.linear(x, W, b), or its prepacked form (models.cpu_linear)
        for a, b, scaling in parts:
            out = out + F.linear(F.linear(x, a), b) * scaling
        return out

    return forward


def _forwards(model: nn.Module) -> list[tuple[nn.Module, Forward]]:
    """The lean forwards of `model`'s LoRA layers for its active adapters (cached per set)."""
    cache: dict[tuple[str, ...], list[tuple[nn.Module, Forward]]] = vars(model).setdefault(_CACHE, {})
    key = tuple(model.active_adapters) if isinstance(model, PeftModel) else ()
    if key not in cache:
        cache[key] = [(m, f) for m in model.modules()
                      if isinstance(m, LoraLinear) and (f := _lean_forward(m)) is not None]
    return cache[key]


def forget(model: nn.Module) -> None:
    """Drop `model`'s cached lean forwards (after its adapters were added or replaced)."""
    vars(model).pop(_CACHE, None)


@contextlib.contextmanager
def lean_lora(model: nn.Module) -> Iterator[None]:
    """Run a block with `model`'s adapted Linears on the lean forward (see the module docstring);
    use it inside `adapter_on`, at inference."""
    installed = _forwards(model)
    for module, forward in installed:
        vars(module)["forward"] = forward  # an instance attribute: nn.Module.__call__ calls it
    try:
        yield
    finally:
        for module, _ in installed:
            vars(module).pop("forward", None)
