"""The tests' Qwen3 tokenizer (tests/qwen3_tokenizer.py) is Qwen3's: its ids, its encoding, its chat
template; and the project loads it as it would Qwen/Qwen3-0.6B's. The expected ids of plain text
are the hub tokenizer's, as public projects pin them."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from peftbd.config import load_config
from peftbd.data.chat import encode_prompt, render_prompt
from peftbd.models.loading import load_tokenizer

QWEN3_VOCAB = 151_936  # Qwen3-0.6B's embedding rows


@pytest.fixture(scope="module")
def tok(qwen3_tokenizer_dir):
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)


def test_added_tokens_have_qwen3_ids(tok):
    assert len(tok) == 151_669
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                                                     "<tool_call>", "<think>", "</think>")}
    assert ids == {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                   "<tool_call>": 151657, "<think>": 151667, "</think>": 151668}
    assert (tok.eos_token, tok.pad_token, tok.bos_token, tok.mask_token) == (
        "<|im_end|>", "<|endoftext|>", None, None)
    # <|im_start|> and <|im_end|> are special tokens, <think> is not: it decodes as text
    assert tok.decode([151644, 151667, 151645], skip_special_tokens=True) == "<think>"


@pytest.mark.parametrize(("text", "ids"), [
    ("Hello, world! 123", [9707, 11, 1879, 0, 220, 16, 17, 18]),  # one digit per token
    ("What is the capital of France?", [3838, 374, 279, 6722, 315, 9625, 30]),
    ("你好世界", [108386, 99489]),
    ("🚀", [145836]),
])
def test_encodes_as_the_hub_tokenizer(tok, text, ids):
    assert tok.encode(text) == ids


def test_mixed_text_round_trips(tok):
    text = "Hello, 世界! Café naïve 🚀🤖 x = 1\n\tdef f(): return '<think>' ❤️"
    ids = tok.encode(text)
    assert len(ids) < len(text.encode())  # merges apply: not one token per byte
    assert tok.decode(ids) == text


def test_chat_template_renders_qwen3_prompts(tok):
    messages = [{"role": "user", "content": "a cat on a skateboard"}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\na cat on a skateboard<|im_end|>\n<|im_start|>assistant\n")
    assert render_prompt(tok, messages).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert encode_prompt(tok, messages) == [
        151644, 872, 198, 64, 8251, 389, 264, 97982, 151645, 198,
        151644, 77091, 198, 151667, 271, 151668, 271]


def test_the_project_loads_it_as_qwen3s(qwen3_tokenizer_dir, tok):
    loaded = load_tokenizer(load_config("qwen3-0.6b", overrides=[
        f"model.name_or_path={qwen3_tokenizer_dir}"]))
    assert loaded.chat_template == tok.chat_template  # the checkpoint's own, kept
    assert loaded.pad_token_id == 151643 and loaded.eos_token_id == 151645
    # the drafter's mask token is the one token the project adds, inside the embedding's rows
    assert loaded.mask_token == "<|mask|>" and loaded.mask_token_id == 151_669 < QWEN3_VOCAB
    assert len(loaded) == len(tok) + 1
