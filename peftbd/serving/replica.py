"""The compute behind every serving replica, as plain-data calls (lists and dicts in and out).

- colocated: `rounds` runs one request's whole loop (prefill, then the engine's `step` until
  done), one `RoundEvent` per step;
- split: the drafter side calls `propose`, the verifier side `prefill` and `verify`; each call
  carries the committed tokens, and the per-request state of the session is reused only when it
  agrees with them (else rebuilt: a `resume`).

One lock serializes model work: the PEFT-BD adapter switch is model-wide, so two requests must
never run forwards at the same time in one replica. Times come from the engine's clock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

from peftbd.decoding import DecodeState, advance
from peftbd.serving.models import ServingModels
from peftbd.serving.rounds import RoundEvent
from peftbd.serving.sessions import Session, SessionStore, resume


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
                max_new_tokens: int, method: str) -> dict[str, Any]:
        """Catch the session up with the newly committed tokens (one adapter-off forward) and
        draft the next block: {draft, draft_ms, sync_ms, handler_ms, resumed}."""
        dec = self.models.decoder(method)
        clock = self.models.clock
        start = clock.now()
        with self.lock:
            sess = self.sessions.get(session_id)
            sync_start = clock.now()
            resumed = False
            if sess is not None and _extends(sess, committed):
                if len(committed) > len(sess.state.tokens):
                    advance(dec.model, sess.state, committed[len(sess.state.tokens):],
                            layers=dec.drafter.kv_layers)  # an early-exit drafter's k layers
            else:  # a new session (its first round), or a lost / stale one
                sess = Session(resume(dec, committed, prompt_len, max_new_tokens))
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

    def prefill(self, session_id: str, prompt_ids: Sequence[int], max_new_tokens: int) -> dict[str, Any]:
        """Start a request: the prompt's forward commits its first token."""
        dec = self.models.decoder("ar")
        start = self.models.clock.now()
        with self.lock:
            state = dec.start(prompt_ids, max_new_tokens)
            self.counters["prefills"] += 1
            if not state.done:
                self.sessions.put(session_id, Session(state))
        end = self.models.clock.now()
        return {"tokens": state.new_tokens, "done": state.done, "finish_reason": _finish(state),
                "prefill_ms": state.prefill_s * 1e3, "handler_ms": (end - start) * 1e3}

    def verify(self, session_id: str, committed: Sequence[int], prompt_len: int,
               max_new_tokens: int, draft: Sequence[int]) -> dict[str, Any]:
        """Verify `draft` after `committed`: {tokens, proposed, accepted, done, finish_reason,
        verify_ms, sync_ms, handler_ms, resumed}; the session is dropped once the request is done."""
        dec = self.models.decoder("ar")
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
        return {"tokens": result.tokens, "proposed": result.proposed, "accepted": result.accepted,
                "done": result.done, "finish_reason": _finish(sess.state),
                "verify_ms": (end - verify_start) * 1e3, "sync_ms": (verify_start - sync_start) * 1e3,
                "handler_ms": (end - start) * 1e3, "resumed": resumed}

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


def _extends(sess: Session, committed: Sequence[int]) -> bool:
    """The session's tokens are a prefix of `committed` and it has not drafted from exactly
    `committed` yet (the MTP drafter consumes each verify's hidden states once)."""
    n = len(sess.state.tokens)
    if n > len(committed) or list(committed[:n]) != sess.state.tokens:
        return False
    return n < len(committed) or sess.proposed_at != n
