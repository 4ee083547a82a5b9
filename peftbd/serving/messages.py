"""The typed items a split Verifier's batched call to its Drafter carries, one per request, and
the typed replies (plain data: they cross Ray hops pickled). Each item carries the committed
tokens, the Verifier's truth, so any Drafter replica can rebuild a request it does not hold.
Times in a reply are the replica's (its engine clock); `handler_ms` is the whole call's time on
the replica, which every item waited for (waiting there behind other calls included), and
`batch_size` the items of the model call that served it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.serving.features import Shipped


@dataclass(frozen=True)
class ProposeItem:
    """Draft the next block after `committed`; `shipped`: what the Verifier computed since the
    drafter's last call of what this request's drafter reads (`peftbd.serving.features`), else
    None."""

    session_id: str
    committed: list[int]
    prompt_len: int
    max_new_tokens: int
    method: str
    shipped: Shipped = None
    sampling: SamplingParams = GREEDY  # drafts are argmax; a rebuilt state keeps the request's


@dataclass(frozen=True)
class AheadItem:
    """Draft the round after the one verifying `draft` (after `committed`) for the outcome
    "`accepted` of its tokens, then the bonus" (`peftbd.decoding.ahead`); `shipped`: what the
    verifier shipped since the drafter's last call (it catches up first)."""

    session_id: str
    committed: list[int]
    method: str
    draft: list[int]
    accepted: int
    shipped: Shipped = None


@dataclass(frozen=True)
class ProposeReply:
    """A draft; `sync_ms`: catching the drafter's state up first (a forward, or taking what the
    verifier shipped); `resumed`: the state was rebuilt past the first round."""

    draft: list[int]
    draft_ms: float
    sync_ms: float
    resumed: bool
    handler_ms: float = 0.0
    batch_size: int = 1


@dataclass(frozen=True)
class AheadReply:
    """A pre-draft: `draft` continues `committed` + the guessed accepted tokens + the bonus,
    whichever it is; empty when the drafter's state cannot reach `committed` without a forward,
    or `drafts_ahead` is False: the method's drafter cannot draft ahead."""

    draft: list[int]
    draft_ms: float
    drafts_ahead: bool = True
    handler_ms: float = 0.0
    batch_size: int = 1


Reply = TypeVar("Reply", ProposeReply, AheadReply)
"""Any one of the Drafter's replies (each carries `handler_ms` and `batch_size`)."""


@dataclass(frozen=True)
class ReplicaStats:
    """What a model replica's `stats()` answers (crosses Ray pickled): its id, open `sessions`
    (split), open `streams` (colocated requests), `busy_s` (seconds its model lock was held:
    forwards and the host work between them), `batch_sizes` (rows per batched step or call:
    how many) and its counters: `prefills`, `resumes` (states rebuilt from committed tokens),
    `rounds`."""

    replica: str
    sessions: int
    streams: int
    busy_s: float
    batch_sizes: dict[int, int]
    prefills: int = 0
    resumes: int = 0
    rounds: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready) for where a stream must carry it; `from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaStats:
        """`to_dict`'s output, also after a JSON round trip (`batch_sizes`'s keys back to ints)."""
        sizes: Mapping[Any, int] = data["batch_sizes"]
        return cls(**{**data, "batch_sizes": {int(k): int(v) for k, v in sizes.items()}})
