"""Incremental detokenization: text deltas whose concatenation is exactly the final text."""

from __future__ import annotations

from collections.abc import Iterable

from transformers import PreTrainedTokenizerBase


class TextStream:
    """Collects committed tokens of one completion and yields its new text as it grows.

    The text of the first n tokens is `tokenizer.decode(ids[:n], skip_special_tokens=True)`, so
    EOS never shows. A trailing U+FFFD (a multi-byte character cut by a token boundary) is held
    back until the next token completes it; `finish()` releases whatever is left.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    @property
    def text(self) -> str:
        """The decoded text of every token pushed so far."""
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def push(self, tokens: Iterable[int]) -> str:
        """Add committed tokens; return the text that became final (may be empty)."""
        self.ids.extend(tokens)
        text = self.text
        safe = text.rstrip("\ufffd")
        return self._advance(safe)

    def finish(self) -> str:
        """The rest of the text (including any held-back characters)."""
        return self._advance(self.text)

    def _advance(self, text: str) -> str:
        if not text.startswith(self.sent):  # never seen with byte-level BPE; wait, don't resend
            return ""
        delta = text[len(self.sent):]
        self.sent = text
        return delta
