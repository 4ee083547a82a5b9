"""Chat rendering: the prompt is the conversation up to the first assistant turn, Qwen3 template,
generation prompt on, thinking off."""

from __future__ import annotations

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
    """Token ids of `render_prompt` (the template already holds every special token)."""
    return tokenizer(render_prompt(tokenizer, messages), add_special_tokens=False)["input_ids"]
