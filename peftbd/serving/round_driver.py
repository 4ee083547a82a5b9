"""The split app's round scheduler (no Ray): one `RoundDriver` per app owns every request's
rounds (prefill, then propose on the Drafter and verify on the Verifier) and keeps both roles fed.

Requests are dealt round-robin into `serving.split_groups` groups; each group's items are
gathered per call kind (`peftbd.serving.gather.Gather`: at most `serving.max_batch`, waiting up
to `serving.batch_wait_ms`) into one batched call. Whom a batch waits for is explicit
(`Course`): a batch waits only for its group's requests heading to it, and a verify for its
group's requests still proposing. A group moves in lockstep; groups do not wait for each other,
so with two or more the Drafter drafts one group while the Verifier verifies another
(PEARL-style overlap across requests); one group is the lockstep of every request. Because one
driver holds every request of the app (whichever Ingress took it), each role sees one batch
stream per group, not one per Ingress and group.

Each item carries the committed tokens, and each propose what the last prefill / verify reply
shipped for the request's drafter. `serving.draft_ahead`: while a group verifies and the Drafter
would idle, it drafts each request's next round for its likeliest accepted length
(`peftbd.decoding.ahead`); a round whose verify accepted exactly that many skips its propose.
`rounds(spec, committed)` resumes a request from tokens already sent (a lost driver's requests,
restarted by the ingress): no prefill, the replicas rebuild what they lack from the committed
tokens. The calls themselves (routing, retries after a
lost replica) are the caller's `send`; `release` forgets a finished request's sessions.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Literal, TypeVar

from peftbd.config import ServingConfig
from peftbd.decoding.ahead import likeliest
from peftbd.serving.features import Shipped, joined
from peftbd.serving.gather import Gather
from peftbd.serving.messages import (
    AheadItem,
    AheadReply,
    PrefillItem,
    PrefillReply,
    ProposeItem,
    ProposeReply,
    VerifyItem,
    VerifyReply,
)
from peftbd.serving.roles import Role
from peftbd.serving.rounds import RoundEvent, prefill_event, split_round
from peftbd.serving.validation import GenerationSpec

CallKind = Literal["prefill", "propose", "ahead", "verify"]
Item = PrefillItem | ProposeItem | AheadItem | VerifyItem
Answer = tuple[PrefillReply | ProposeReply | AheadReply | VerifyReply, float] | BaseException
"""A batched call's answer for one item: (its reply, its share of the call's transport ms), or
the error of the call that carried it."""
Send = Callable[[CallKind, Sequence[Item]], Awaitable[Sequence[Answer]]]
"""One batched call of a kind (prefill / verify: the Verifier; propose / ahead: the Drafter):
the answers in item order."""
Release = Callable[[Role, str], None]
"""Forget a request's session (by its id) on a role's replica; fire and forget."""

_R = TypeVar("_R", PrefillReply, ProposeReply, AheadReply, VerifyReply)


class Course:
    """Where one request of `group` is: heading to a call (`("to", kind, group)`, between two
    calls) or in one (`("in", kind, group)`, pending or sent), counted in `counts`; `changed`
    runs on every move (the gathers re-check whom to wait for: `Gather.expected` / `behind`)."""

    def __init__(self, counts: collections.Counter, changed: Callable[[], None],
                 group: int = 0) -> None:
        self.counts, self.changed, self.group = counts, changed, group
        self.where: tuple[str, str, int] | None = None

    def move(self, where: tuple[str, str] | None) -> None:
        if self.where is not None:
            self.counts[self.where] -= 1
        self.where = None if where is None else (*where, self.group)
        if self.where is not None:
            self.counts[self.where] += 1
        self.changed()


class RoundDriver:
    """Runs every request's rounds of one split app (see the module doc)."""

    def __init__(self, send: Send, release: Release, serving: ServingConfig) -> None:
        self.release = release
        self.groups = serving.split_groups
        self._where: collections.Counter = collections.Counter()
        self._dealt = itertools.count()
        count = self._where.__getitem__
        self.draft_ahead = serving.draft_ahead
        self._no_ahead: set[str] = set()
        kinds: tuple[CallKind, ...] = ("prefill", "propose", "ahead", "verify")
        self._gathers = {
            (kind, g): Gather(functools.partial(send, kind), serving.max_batch,
                              serving.batch_wait_ms, functools.partial(count, ("to", kind, g)),
                              # a verify waits for its group's requests still proposing
                              functools.partial(count, ("in", "propose", g)) if kind == "verify"
                              else lambda: 0)
            for kind in kinds for g in range(self.groups)
        }

    def _changed(self) -> None:
        for gather in self._gathers.values():
            gather.poke()

    async def _call(self, kind: CallKind, item: Item, course: Course,
                    expected: type[_R]) -> tuple[_R, float]:
        """(the `expected` reply to `item`, its share of the call's transport ms), the request's
        course in the call meanwhile."""
        course.move(("in", kind))
        return await self._answer(kind, item, course.group, expected)

    async def _answer(self, kind: CallKind, item: Item, group: int,
                      expected: type[_R]) -> tuple[_R, float]:
        """`_call` without a course (a pre-draft's call runs beside the request's verify)."""
        result = await self._gathers[kind, group].call(item)
        if isinstance(result, BaseException):
            raise result
        reply, share = result
        if not isinstance(reply, expected):
            raise TypeError(f"a {kind} call answered a {type(reply).__name__}, not a "
                            f"{expected.__name__}")
        return reply, share

    def _ahead(self, spec: GenerationSpec, committed: list[int], draft: list[int],
               history: list[int], course: Course, shipped: Shipped
               ) -> tuple[asyncio.Task[tuple[AheadReply, float]], int] | None:
        """With `serving.draft_ahead`, the Drafter drafting the next round for the likeliest
        accepted length of the round now verifying (`peftbd.decoding.ahead.likeliest`): the
        call's task and that length; only while the Drafter would idle (no other group has
        requests, whose proposes would wait behind it, and no propose of this group is waiting
        or running), else None."""
        if not self.draft_ahead or not draft or spec.method in self._no_ahead:
            return None
        elsewhere = sum(n for (_, _, g), n in self._where.items() if g != course.group)
        if elsewhere or not self._gathers["propose", course.group].idle:
            return None
        guess = likeliest(history, len(draft))
        item = AheadItem(spec.request_id, committed, spec.method, draft, guess, shipped)
        task = asyncio.get_running_loop().create_task(
            self._answer("ahead", item, course.group, AheadReply))
        task.add_done_callback(functools.partial(self._answered, spec.method))
        return task, guess

    def _answered(self, method: str, task: asyncio.Task[tuple[AheadReply, float]]) -> None:
        """Note a method whose Drafter answered that it cannot draft ahead, so its requests stop
        asking; also retrieves a failed call's error (a missed guess's call nobody awaits)."""
        if not task.cancelled() and task.exception() is None and not task.result()[0].drafts_ahead:
            self._no_ahead.add(method)

    async def rounds(self, spec: GenerationSpec, committed: Sequence[int] = ()
                     ) -> AsyncGenerator[RoundEvent, None]:
        """The request's steps: its prefill (unless `committed` already extends the prompt: a
        resumed request), then a round at a time until done."""
        sid, prompt, budget = spec.request_id, list(spec.prompt_ids), spec.max_new_tokens
        first = "verify" if spec.method == "ar" else "propose"  # of each round
        course = Course(self._where, self._changed, next(self._dealt) % self.groups)
        try:
            if len(committed) > len(prompt):
                tokens, shipped = list(committed), None
                course.move(("to", first))
            else:
                course.move(("to", "prefill"))
                started, share = await self._call(
                    "prefill", PrefillItem(sid, prompt, budget, spec.method, spec.sampling),
                    course, PrefillReply)
                event = prefill_event(started, share, started.batch_size)
                tokens, shipped = prompt + event.tokens, started.shipped
                course.move(None if event.done else ("to", first))
                yield event
                if event.done:
                    return
            history: list[int] = []  # the request's accepted lengths, round by round
            pre: ProposeReply | None = None  # this round's draft, drafted ahead
            while True:
                proposal: ProposeReply | None = None
                draft_share, ahead = 0.0, None
                if spec.method != "ar":
                    if pre is None:
                        proposal, draft_share = await self._call("propose", ProposeItem(
                            sid, tokens, len(prompt), budget, spec.method, shipped, spec.sampling),
                            course, ProposeReply)
                        shipped = None  # delivered
                    course.move(("to", "verify"))
                draft = (proposal or pre or ProposeReply([], 0.0, 0.0, False)).draft
                if spec.method != "ar":
                    ahead = self._ahead(spec, tokens, draft, history, course, shipped)
                    shipped = None if ahead else shipped
                reply, verify_share = await self._call("verify", VerifyItem(
                    sid, tokens, len(prompt), budget, draft, spec.method, spec.sampling), course,
                    VerifyReply)
                # what the Drafter has not taken yet (a round drafted ahead took nothing)
                shipped = joined(shipped, reply.shipped)
                event = split_round(proposal or pre, draft_share, reply, verify_share,
                                    reply.batch_size, pre_drafted=pre is not None)
                tokens, pre = tokens + event.tokens, None
                history.append(reply.accepted)
                if ahead is not None and not event.done:
                    pre = await _pre_draft(ahead, reply.accepted)
                course.move(None if event.done else ("to", "verify" if pre else first))
                yield event
                if event.done:
                    return
        finally:  # also when the client left
            course.move(None)
            if spec.method != "ar":
                self.release(Role.DRAFTER, sid)
            self.release(Role.VERIFIER, sid)


async def _pre_draft(ahead: tuple[asyncio.Task[tuple[AheadReply, float]], int],
                     accepted: int) -> ProposeReply | None:
    """The next round's draft from a pre-draft call (its task, its guessed accepted length) when
    the verify accepted exactly that many tokens (the pre-draft continues any bonus), else None
    without waiting for the call."""
    task, guessed = ahead
    if accepted != guessed:
        return None
    try:
        got, _ = await task
    except Exception:  # a lost pre-draft costs the ordinary propose, nothing else
        return None
    if not got.draft:
        return None
    return ProposeReply(got.draft, got.draft_ms, 0.0, False, got.handler_ms, got.batch_size)
