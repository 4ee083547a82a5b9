"""Incremental detokenization: text deltas whose concatenation is exactly the final text, cut
before the first stop sequence."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from transformers import PreTrainedTokenizerBase


class TextStream:
    """Collects committed tokens of one completion and yields its new text as it grows.

    The text of the first n tokens is `tokenizer.decode(ids[:n], skip_special_tokens=True)`, so
    EOS never shows. A trailing U+FFFD (a multi-byte character cut by a token boundary) is held
    back until the next token completes it, and so is a tail that could begin a stop sequence;
    `finish()` releases whatever is left. Once a stop sequence appears the text ends before it
    (`stopped`; vLLM's rule) and `ids` keeps the tokens up to the one that completed it.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[int] = []
        self.sent = ""
        self.stopped = False

    @property
    def text(self) -> str:
        """The decoded text of every token kept so far."""
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, tokens: Iterable[int]) -> str:
        """Add committed tokens; return the text that became final (may be empty)."""
        if self.stopped:
            return ""
        before = len(self.ids)
        self.ids.extend(tokens)
        safe = self.text.rstrip("\ufffd")
        cut = self._stop_at(safe)
        if cut is not None:
            self._keep_through_stop(before)
            self.stopped = True
            return self._advance(safe[:cut])
        return self._advance(safe[: len(safe) - self._held(safe)])

    def finish(self) -> str:
        """The rest of the text (including any held-back characters)."""
        return "" if self.stopped else self._advance(self.text)

    def _stop_at(self, text: str) -> int | None:
        """Where the first stop sequence starts in `text` (never before the text already sent)."""
        hits = [i for s in self.stop if (i := text.find(s, len(self.sent))) >= 0]
        return min(hits) if hits else None

    def _held(self, text: str) -> int:
        """Length of the longest tail of `text` that a stop sequence starts with."""
        return max((n for s in self.stop for n in range(min(len(s) - 1, len(text)), 0, -1)
                    if s.startswith(text[len(text) - n:])), default=0)

    def _keep_through_stop(self, before: int) -> None:
        """Drop the tokens after the one that completed the stop sequence."""
        ids = self.ids
        for n in range(before + 1, len(ids) + 1):
            self.ids = ids[:n]
            if self._stop_at(self.text.rstrip("\ufffd")) is not None:
                return

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent):  # never seen with byte-level BPE; wait, don't resend
            return ""
        delta = text[len(self.sent):]
        self.sent = text
        return delta
