"""Per-request decoding state kept in a replica between rounds, keyed by session id.

The ingress owns the truth: it sends the committed tokens with every call. A replica reuses its
state only when that state is consistent with them and otherwise rebuilds it from the committed
tokens (`resume_many`: one verifier forward, batched over the requests being rebuilt), so a
lost, evicted or stale state costs a re-prefill but never changes the output.
A split drafter's first round starts from what the verifier's prefill shipped (`from_shipped`:
no forward of its own).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from peftbd.decoding import DecodeState, SpeculativeDecoder, advance_shipped, new_state
from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.decoding.scheduler import resumed
from peftbd.serving.features import FINAL_HIDDEN, FeatureBlock, KVBlock


@dataclass
class Session:
    """One request's state in a replica; `proposed_at` = len(state.tokens) when the drafter last
    proposed (the MTP drafter consumes each verify's hidden states exactly once)."""

    state: DecodeState
    proposed_at: int = -1
    cache_behind: bool = False
    """Its verifier cache fell behind (it took shipped features or hidden states): it can catch
    up only with what the verifier ships, or be rebuilt."""


def resume_many(decoder: SpeculativeDecoder, committed: Sequence[Sequence[int]],
                prompt_lens: Sequence[int], max_new_tokens: Sequence[int],
                sampling: Sequence[SamplingParams] | None = None) -> list[DecodeState]:
    """States whose committed tokens are exactly `committed` (prompt + generated so far), one per
    request, with one batched prefill.

    The engine's `prefill` over `committed[:-1]`, then `peftbd.decoding.scheduler.resumed`
    (the ingress's last token in place of the one prefill chose, the request's prompt length and
    budget restored); `start` set the drafter's state up for it.
    """
    for c, n in zip(committed, prompt_lens):
        if not 0 < n < len(c):
            raise ValueError(
                f"resume needs the prompt plus at least one generated token: prompt_len={n}, "
                f"{len(c)} committed tokens"
            )
    states = decoder.start_many([c[:-1] for c in committed], 1, sampling)
    return [resumed(state, c, n, budget)
            for state, c, n, budget in zip(states, committed, prompt_lens, max_new_tokens)]


def from_shipped(decoder: SpeculativeDecoder, committed: Sequence[int], prompt_len: int,
                 max_new_tokens: int, block: FeatureBlock | KVBlock,
                 sampling: SamplingParams = GREEDY) -> DecodeState:
    """A split drafter's state built without a forward from the verifier's prefill reply:
    `block` holds what the drafter reads of every position of `committed[:-1]` (the head's
    features, FastMTP's final hidden states, or PEFT-BD's KV). From features or hidden states
    the verifier cache stays empty; from KV it holds the layers the drafter reads. Either may
    draft, never verify."""
    if not block.covers(0, len(committed) - 1):
        raise ValueError(f"shipped state of positions {block.start}..{block.end - 1} cannot start "
                         f"a state of {len(committed)} committed tokens (need 0..{len(committed) - 2})")
    state = new_state(decoder.model, committed[:-1], max_new_tokens, decoder.eos_ids,
                      decoder.drafter.feature_layers, sampling=sampling, path=decoder.path,
                      pool=decoder.pool)
    state.prompt_len = prompt_len
    advance_shipped(state, committed[-1:], **taken(block, state.device, decoder.drafter.reads_kv_layers))
    decoder.drafter.start(state)
    return state


def taken(block: FeatureBlock | KVBlock, device: torch.device,
          reads_kv_layers: int | None) -> dict[str, Any]:
    """`advance_shipped`'s keyword for a shipped block (KV: the layers the drafter reads, all
    for None; the verifier ships every layer)."""
    if isinstance(block, KVBlock):
        return {"kv": block.decode(device)[:reads_kv_layers]}
    return {"hidden" if block.layers == FINAL_HIDDEN else "features": block.decode(device)}


class SessionStore:
    """Least-recently-used map of session id -> `Session`, at most `max_sessions` entries.

    A dropped id stays dropped: a call of an abandoned request that was still running when its
    release arrived cannot put its session back (the last `max_sessions` dropped ids are kept).
    """

    def __init__(self, max_sessions: int) -> None:
        if max_sessions < 1:
            raise ValueError(f"serving.max_sessions={max_sessions}; must be >= 1")
        self.max_sessions = max_sessions
        self._states: OrderedDict[str, Session] = OrderedDict()
        self._dropped: OrderedDict[str, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._states)

    def get(self, session_id: str) -> Session | None:
        """The state of `session_id` (marked most recently used), or None."""
        state = self._states.get(session_id)
        if state is not None:
            self._states.move_to_end(session_id)
        return state

    def put(self, session_id: str, session: Session) -> None:
        """Keep `session` (unless its id was dropped); evicts the least recently used beyond
        `max_sessions`."""
        if session_id in self._dropped:
            return
        self._states[session_id] = session
        self._states.move_to_end(session_id)
        while len(self._states) > self.max_sessions:
            self._states.popitem(last=False)

    def drop(self, session_id: str) -> None:
        """Forget `session_id` (a finished or abandoned request) for good."""
        self._states.pop(session_id, None)
        self._dropped[session_id] = None
        while len(self._dropped) > self.max_sessions:
            self._dropped.popitem(last=False)
