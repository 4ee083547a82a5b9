"""The compute behind every serving replica, as plain-data calls (lists and dicts in and out).

- colocated: `rounds` runs one request's whole loop (prefill, then the engine's `step` until
  done), one `RoundEvent` per step;
- split: the drafter side calls `propose`, the verifier side `prefill` and `verify`; each call
  carries the committed tokens, and the per-request state of the session is reused only when it
  agrees with them (else rebuilt: a `resume`). For a drafter that reads verifier features (the
  block-diffusion head), the verifier's replies carry the features of the positions it cached
  (`FeatureBlock`) and the next `propose` takes them instead of running the verifier itself.

One lock serializes model work: the PEFT-BD adapter switch is model-wide, so two requests must
never run forwards at the same time in one replica. Times come from the engine's clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from peftbd.decoding import DecodeState, SpeculativeDecoder, advance, advance_with_features
from peftbd.serving.features import FeatureBlock
from peftbd.serving.models import ServingModels
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.sessions import Session, SessionStore, from_features, resume


class ReplicaDecoder:
    """A replica's models plus its per-request sessions and counters."""

    def __init__(self, models: ServingModels, max_sessions: int) -> None:
        self.models = models
        self.sessions = SessionStore(max_sessions)
        self.lock = threading.Lock()
        self.counters = {"prefills": 0, "resumes": 0, "rounds": 0}
        self.streams = 0
        """Colocated loops running now (their state lives in the loop: it ends when it is closed)."""

    # colocated -----------------------------------------------------------------------------

    def rounds(self, prompt_ids: Sequence[int], max_new_tokens: int, method: str,
               committed: Sequence[int] = ()) -> Iterator[RoundEvent]:
        """One request's loop. `committed` (prompt + tokens already sent) resumes a request whose
        replica died: its first event then commits nothing."""
        dec = self.models.decoder(method)
        resumed = len(committed) > len(prompt_ids)
        with self.lock:
            self.streams += 1
        try:
            with self.lock:
                if resumed:
                    state = resume(dec, committed, len(prompt_ids), max_new_tokens)
                else:
                    state = dec.start(prompt_ids, max_new_tokens)
                self._count_rebuild(fresh=not resumed)
            yield RoundEvent(
                tokens=[] if resumed else state.new_tokens, other_ms=state.prefill_s * 1e3,
                resumes=int(resumed), done=state.done, prefill=True, finish_reason=_finish(state),
            )
            while not state.done:
                with self.lock:
                    rec = dec.step(state)
                    self.counters["rounds"] += 1
                yield RoundEvent(
                    tokens=state.tokens[len(state.tokens) - rec.emitted:], proposed=rec.proposed,
                    accepted=rec.accepted, draft_ms=rec.draft_ms, verify_ms=rec.verify_ms,
                    other_ms=rec.other_ms, done=state.done, finish_reason=_finish(state),
                )
        finally:  # also when the stream is closed early (client gone, stop sequence)
            with self.lock:
                self.streams -= 1

    # split: drafter side -------------------------------------------------------------------

    def propose(self, session_id: str, committed: Sequence[int], prompt_len: int,
                max_new_tokens: int, method: str,
                features: FeatureBlock | None = None) -> dict[str, Any]:
        """Catch the session up with the newly committed tokens and draft the next block:
        {draft, draft_ms, sync_ms, handler_ms, resumed}. Catching up is one adapter-off forward,
        or none for a drafter that reads verifier features: `features` (the last prefill /
        verify reply's) then hold those of the newly cached positions."""
        dec = self.models.decoder(method)
        _check_layers(dec, features)
        clock = self.models.clock
        start = clock.now()
        with self.lock:
            sess = self.sessions.get(session_id)
            sync_start = clock.now()
            resumed = False
            if not _caught_up(dec, sess, committed, features):
                # a new session (its first round), or a lost / stale one
                if features is not None and features.covers(0, len(committed) - 1):
                    # the prefill's features of every cached position: no forward
                    state = from_features(dec, committed, prompt_len, max_new_tokens, features)
                else:
                    state = resume(dec, committed, prompt_len, max_new_tokens)
                sess = Session(state)
                resumed = len(committed) > prompt_len + 1
                self._count_rebuild(fresh=not resumed)
                self.sessions.put(session_id, sess)
            draft_start = clock.now()
            draft = dec.propose(sess.state)[0].tolist()
            sess.proposed_at = len(sess.state.tokens)
            end = clock.now()
        return {"draft": draft, "draft_ms": (end - draft_start) * 1e3,
                "sync_ms": (draft_start - sync_start) * 1e3, "handler_ms": (end - start) * 1e3,
                "resumed": resumed}

    # split: verifier side ------------------------------------------------------------------

    def prefill(self, session_id: str, prompt_ids: Sequence[int], max_new_tokens: int,
                method: str = "ar") -> dict[str, Any]:
        """Start a request of `method`: the prompt's forward commits its first token;
        `features`: the prompt positions' features when its drafter reads them, else None."""
        dec = self.models.verifier_decoder(method)
        start = self.models.clock.now()
        with self.lock:
            state = dec.start(prompt_ids, max_new_tokens)
            self.counters["prefills"] += 1
            if not state.done:
                self.sessions.put(session_id, Session(state))
            features = _reply_features(state)
        end = self.models.clock.now()
        return {"tokens": state.new_tokens, "done": state.done, "finish_reason": _finish(state),
                "prefill_ms": state.prefill_s * 1e3, "handler_ms": (end - start) * 1e3,
                "features": features}

    def verify(self, session_id: str, committed: Sequence[int], prompt_len: int,
               max_new_tokens: int, draft: Sequence[int], method: str = "ar") -> dict[str, Any]:
        """Verify `draft` after `committed`: {tokens, proposed, accepted, done, finish_reason,
        verify_ms, sync_ms, handler_ms, resumed, features}; the session is dropped once the
        request is done. `features`: as in `prefill`, of the positions this verify cached."""
        dec = self.models.verifier_decoder(method)
        clock = self.models.clock
        start = clock.now()
        with self.lock:
            sess = self.sessions.get(session_id)
            sync_start = clock.now()
            resumed = sess is None or sess.state.tokens != list(committed)
            if resumed:
                sess = Session(resume(dec, committed, prompt_len, max_new_tokens))
                self._count_rebuild(fresh=False)
                self.sessions.put(session_id, sess)
            verify_start = clock.now()
            result = dec.verify(sess.state, list(draft))
            end = clock.now()
            self.counters["rounds"] += 1
            if result.done:
                self.sessions.drop(session_id)
            features = _reply_features(sess.state)
        return {"tokens": result.tokens, "proposed": result.proposed, "accepted": result.accepted,
                "done": result.done, "finish_reason": _finish(sess.state),
                "verify_ms": (end - verify_start) * 1e3, "sync_ms": (verify_start - sync_start) * 1e3,
                "handler_ms": (end - start) * 1e3, "resumed": resumed, "features": features}

    def release(self, session_id: str) -> None:
        """Forget a finished or abandoned session."""
        with self.lock:
            self.sessions.drop(session_id)

    def _count_rebuild(self, fresh: bool) -> None:
        self.counters["prefills" if fresh else "resumes"] += 1


def _finish(state: DecodeState) -> str | None:
    """`stop` when a finished request ended on EOS, `length` when on its budget, else None."""
    if not state.done:
        return None
    return "stop" if state.tokens[-1] in state.eos_ids else "length"


def _reply_features(state: DecodeState) -> FeatureBlock | None:
    """The features of the positions the last forward added to `state.cache`, for the remote
    drafter's next `propose` (None when the request keeps none or is done)."""
    if state.features is None or state.done:
        return None
    start = state.cache.get_seq_length() - state.features.shape[1]
    return FeatureBlock.encode(state.features, state.feature_layers, start)


def _check_layers(dec: SpeculativeDecoder, block: FeatureBlock | None) -> None:
    if block is not None and block.layers != dec.drafter.feature_layers:
        raise ValueError(
            f"the Verifier sent features of verifier layers {list(block.layers)} but this "
            f"Drafter's {dec.drafter.name} reads {list(dec.drafter.feature_layers)}: deploy both "
            "with the same head_dir (or, untrained, the same head.feature_layers)"
        )


def _caught_up(dec: SpeculativeDecoder, sess: Session | None, committed: Sequence[int],
               block: FeatureBlock | None) -> bool:
    """Bring a reusable session up to `committed` (False: it cannot be reused). A drafter that
    reads verifier features takes `block`, which must cover exactly the positions cached since
    the session's last round; others catch up with `advance` (the drafter's `kv_layers`)."""
    if sess is None or not _extends(sess, committed):
        return False
    state, new = sess.state, committed[len(sess.state.tokens):]
    if dec.drafter.feature_layers:
        if block is None or not block.covers(len(state.tokens) - 1, len(committed) - 1):
            return False  # e.g. a session of an earlier replica, several rounds behind
        if new:
            advance_with_features(state, new, block.decode(state.device))
    elif new:
        advance(dec.model, state, new, layers=dec.drafter.kv_layers)  # early exit: its k layers
    return True


def _extends(sess: Session, committed: Sequence[int]) -> bool:
    """The session's tokens are a prefix of `committed` and it has not drafted from exactly
    `committed` yet (the MTP drafter consumes each verify's hidden states once)."""
    n = len(sess.state.tokens)
    if n > len(committed) or list(committed[:n]) != sess.state.tokens:
        return False
    return n < len(committed) or sess.proposed_at != n
