import pytest
from transformers import AutoTokenizer

from peftbd.data.chat import BadRow, encode_prompt, prompt_messages, render_prompt

TEXTS = [
    "Hello, world! Return the path's basename.",
    "  leading spaces,\ttabs\nand new lines\n\n",
    "Unicode: naïve café — 東京 🚀",
    "def f(x):\n    return x ** 2  # comment",
]


@pytest.fixture(scope="module")
def tok(tiny_world):
    return AutoTokenizer.from_pretrained(tiny_world.tokenizer_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips_text(tok, text):
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def test_special_tokens_are_single_ids(tok):
    for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|mask|>", "<think>", "</think>"):
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1, t


def test_chat_rendering_matches_qwen3_template_with_thinking_off(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    assert render_prompt(tok, messages) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    # thinking on: the generation prompt opens no think block (the model would)
    on = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert on.endswith("<|im_start|>assistant\n")
    # a finished final assistant turn carries the empty think block, as Qwen3's template does
    full = tok.apply_chat_template(messages + [{"role": "assistant", "content": "Yo."}], tokenize=False)
    assert full.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nYo.<|im_end|>\n")
    ids = encode_prompt(tok, messages)
    assert tok.decode(ids) == render_prompt(tok, messages)
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")


def test_prompt_is_the_conversation_up_to_the_first_assistant_turn():
    msgs = [
        {"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"},
    ]
    assert prompt_messages(msgs) == msgs[:2]


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        (None, "no_messages"),
        ([], "no_messages"),
        ([{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}], "no_user_turn"),
        ([{"role": "user", "content": ["list", "content"]}], "non_string_content"),
        ([{"role": "user", "content": "   "}], "empty_text"),
    ],
)
def test_bad_rows_name_their_reason(messages, reason):
    with pytest.raises(BadRow) as err:
        prompt_messages(messages)
    assert err.value.reason == reason
