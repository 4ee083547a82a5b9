"""A byte-level BPE tokenizer trained locally with `tokenizers`, with Qwen's special tokens."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from peftbd.data.chat import QWEN3_CHAT_TEMPLATE

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MASK)
THINK_TOKENS = ("<think>", "</think>")
"""Added but not special, as in Qwen3: they decode as text."""

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2/Qwen3's pre-tokenizer split pattern."""


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a Qwen-style byte-level BPE on `texts`; deterministic for the same texts and size."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        mask_token=MASK,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    fast.add_tokens(list(THINK_TOKENS))
    fast.chat_template = QWEN3_CHAT_TEMPLATE
    return fast
