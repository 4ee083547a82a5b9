"""One request's answer as its steps arrive: the text deltas (cut before the first stop
sequence), the finish reason, and usage counted over what the client received."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from peftbd.serving.rounds import RequestStats, RoundEvent
from peftbd.serving.schemas import FinishReason
from peftbd.serving.text_stream import TextStream


class RequestOutcome:
    """Feed it a request's steps in order (`push`); it says what text became final and keeps
    `completion_tokens`, `finish_reason` and `stats` (`usage.speculative`) for exactly the tokens
    the client gets: after a stop sequence, the rest of the step that completed it (and the
    draft tokens accepted there) is neither returned nor counted."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, method: str, stop: Sequence[str] = (),
                 synthetic: float | None = None, temperature: float = 0.0) -> None:
        self.stream = TextStream(tokenizer, stop)
        self.stats = RequestStats(method, synthetic, temperature)
        self.finish_reason: FinishReason = "length"

    @property
    def completion_tokens(self) -> int:
        """Tokens returned so far (up to the one that completed a stop sequence; vLLM's rule)."""
        return len(self.stream.ids)

    @property
    def stopped(self) -> bool:
        """A stop sequence ended the text: no step after this one is wanted."""
        return self.stream.stopped

    def push(self, event: RoundEvent) -> tuple[str, RoundEvent]:
        """Count one step; (the text that became final, the step as the client received it:
        what metrics should observe)."""
        if event.finish_reason:
            self.finish_reason = event.finish_reason
        before = len(self.stream.ids)
        delta = self.stream.push(event.tokens)
        received = event.received(len(self.stream.ids) - before)
        self.stats.add(received)
        if self.stream.stopped:
            self.finish_reason = "stop"
        return delta, received

    def finish(self) -> str:
        """The rest of the text once the steps ended without a stop sequence."""
        return self.stream.finish()
