"""The split app in one process, deterministic: a Verifier's scheduler (`remote_decoder`, as its
step loop runs it) whose drafts come from a Drafter replica here (`LocalCalls`, what
`serve_apps.backends.DrafterHandleCalls` does over Ray), stepped by the test itself."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from peftbd.decoding.sampling import GREEDY, SamplingParams
from peftbd.decoding.scheduler import Scheduler
from peftbd.serving.batcher import step_event
from peftbd.serving.messages import AheadItem, AheadReply, ProposeItem, ProposeReply
from peftbd.serving.models import ServingModels
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.rounds import RoundEvent


@dataclass
class LocalCalls:
    """`DrafterCalls` over `drafter`, a Drafter replica in this process. It records every item
    and draft; `oracle` (a request's expected new tokens) replaces each draft, so verifies accept
    whole blocks; releases are recorded, not made (the test reads the sessions afterwards)."""

    drafter: ReplicaDecoder
    oracle: Sequence[int] | None = None
    items: list[ProposeItem] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def propose(self, items: Sequence[ProposeItem]) -> list[ProposeReply]:
        replies = self.drafter.propose_batch(items)
        self.items += items
        self.drafts += [r.draft for r in replies]
        if self.oracle is None:
            return replies
        return [replace(r, draft=list(self.oracle[len(it.committed) - it.prompt_len:][: len(r.draft)]))
                for it, r in zip(items, replies)]

    def ahead(self, items: Sequence[AheadItem]) -> Callable[[], list[AheadReply]]:
        replies = self.drafter.ahead_batch(items)
        return lambda: replies

    def release(self, session_id: str) -> None:
        self.released.append(session_id)

    def session(self):
        """The drafter session of the (last) request proposed for."""
        return self.drafter.sessions.get(self.items[-1].session_id)


def split_decode(verifier: ServingModels, calls: LocalCalls, prompt: Sequence[int], method: str,
                 max_new: int, sampling: SamplingParams = GREEDY, lose_at: int | None = None,
                 on_round: Callable[[int], None] | None = None) -> tuple[list[int], list[RoundEvent]]:
    """One request through a split Verifier's scheduler: its new tokens and its steps' events.
    At round `lose_at` the Verifier is lost (the request resumes on a fresh one from the
    committed tokens, as the ingress resumes it); `on_round(n)` runs before round n."""

    def scheduler(committed: list[int]) -> Scheduler:
        s = Scheduler(verifier.remote_decoder(method, calls), 1)
        s.add("r", committed, max_new, sampling, len(prompt))
        return s

    committed, events, rounds = list(prompt), [], 0
    sched = scheduler(committed)
    while sched.busy:
        if on_round is not None:
            on_round(rounds)
        for s in sched.step():
            event = step_event(s, int(s.prefill and len(committed) > len(prompt)))
            events.append(event)
            committed += event.tokens
            rounds += not s.prefill
        if sched.busy and rounds == lose_at:
            lose_at = None
            sched = scheduler(committed)
    return committed[len(prompt):], events
