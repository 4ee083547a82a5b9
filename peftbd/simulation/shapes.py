"""What a simulated device is asked to price: one forward (or one propose phase) of one method at
one batch shape, and the cost model that prices it (`CostModel`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

ForwardKind = Literal["prefill", "verify", "draft"]
"""prefill: one packed prefill chunk of the verifier; verify: one batched verify (AR's decode
step is a verify of width 1); draft: one batched propose of a method's drafter (all of its
forwards for the round)."""


@dataclass(frozen=True)
class ForwardShape:
    """One forward as the scheduler issued it. `method`: the serving name of the method whose
    request it serves ("ar", "peftbd", "fastmtp", "head", ...); `rows`: requests in the batch;
    `width`: tokens per row the forward computes (prefill: the chunk's tokens over all rows;
    verify: the draft + 1; draft: the tokens drafted per row); `kv_tokens`: the committed tokens
    of all its rows that it attends to (the KV it reads)."""

    kind: ForwardKind
    method: str
    rows: int
    width: int
    kv_tokens: int


class CostModel(Protocol):
    """Prices forwards and hops on one kind of device. `name` is how reports label every number
    it produced (e.g. "fitted: this box, placement run of <date>", "roofline: H100 bf16 +
    0.4 ms/forward (SGLang AR step)")."""

    @property
    def name(self) -> str: ...

    def forward_ms(self, shape: ForwardShape) -> float:
        """Milliseconds `shape` occupies its device."""

    def hop_ms(self, payload_bytes: int) -> float:
        """Milliseconds one remote call between two devices adds (a split Verifier's propose to
        its Drafter, `payload_bytes` of verifier state shipped with it)."""
