"""Chat rendering: the prompt is the conversation up to the first assistant turn, Qwen3 template,
generation prompt on, thinking off."""

from __future__ import annotations

import re
from importlib import resources
from typing import Any

from transformers import PreTrainedTokenizerBase

QWEN3_CHAT_TEMPLATE = resources.files("peftbd.data").joinpath("qwen3_chat_template.jinja").read_text()
"""Qwen3's chat template (tool calls, system turn, empty think block when thinking is off)."""


class BadRow(ValueError):
    """A source row that cannot become a prompt; `reason` is the counter key in manifests."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


def prompt_messages(messages: Any) -> list[dict[str, str]]:
    """The turns before the first assistant turn (a system turn is kept); raises `BadRow`."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise BadRow("no_messages")
    prompt: list[dict[str, str]] = []
    for turn in messages:
        if not isinstance(turn, dict) or "role" not in turn:
            raise BadRow("malformed_turn", repr(turn)[:80])
        if turn["role"] == "assistant":
            break
        content = turn.get("content")
        if not isinstance(content, str):
            raise BadRow("non_string_content", type(content).__name__)
        prompt.append({"role": str(turn["role"]), "content": content})
    if not any(t["role"] == "user" for t in prompt):
        raise BadRow("no_user_turn")
    if not any(t["content"].strip() for t in prompt if t["role"] == "user"):
        raise BadRow("empty_text")
    return prompt


def render_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> str:
    """The chat-template text of `messages` with the assistant generation prompt, thinking off."""
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )


def encode_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `render_prompt` in which only the template's own markers are control tokens.

    The template is rendered with a placeholder per message content; its text is cut at the added
    tokens it wrote (each becomes its id) and every other stretch, with the contents put back, is
    encoded as plain text (`encode_plain`). So `<|im_start|>`, `<think>` or any other added token
    inside a message is plain text, and a message without one encodes exactly as before.
    """
    holders = [f"\x00peftbd-content-{i}\x00" for i in range(len(messages))]
    rendered = render_prompt(
        tokenizer, [{**m, "content": h} for m, h in zip(messages, holders)]
    )
    contents = dict(zip(holders, (m["content"] for m in messages)))
    added = tokenizer.get_added_vocab()
    ids: list[int] = []
    for piece in _split_at(rendered, added):
        if piece in added:
            ids.append(added[piece])
        elif piece:
            ids += encode_plain(tokenizer, _PLACEHOLDER.sub(lambda m: contents[m[0]], piece))
    return ids


def encode_plain(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of `text` with no added or special token recognized: the tokenizer's normalizer,
    pre-tokenizer and model alone (what it does between two added tokens)."""
    backend = tokenizer.backend_tokenizer
    if backend.normalizer is not None:
        text = backend.normalizer.normalize_str(text)
    pieces = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer else [(text, None)]
    return [token.id for piece, _ in pieces for token in backend.model.tokenize(piece)]


_PLACEHOLDER = re.compile("\x00peftbd-content-[0-9]+\x00")


def _split_at(text: str, tokens: dict[str, int]) -> list[str]:
    """`text` cut before and after every occurrence of one of `tokens` (longest match first)."""
    if not tokens:
        return [text]
    alternatives = "|".join(map(re.escape, sorted(tokens, key=len, reverse=True)))
    return re.split(f"({alternatives})", text)
