"""Fixtures for the Serve tests: free loopback ports and the engine's reference outputs."""

from __future__ import annotations

import socket

import pytest

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def free_port():
    """A function returning a free TCP port on 127.0.0.1."""
    return _free_port


@pytest.fixture(scope="session")
def engine(tiny_cfg):
    """(tokenizer, greedy(prompt_text, max_tokens) -> text): the engine's output, in-process."""
    from peftbd.data.chat import encode_prompt
    from peftbd.decoding import decode
    from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier

    tok = load_tokenizer(tiny_cfg)
    model = load_verifier(tiny_cfg)
    eos = eos_token_ids(model, tok)
    cache: dict[tuple[str, int], str] = {}

    def greedy(user_text: str, max_tokens: int) -> str:
        key = (user_text, max_tokens)
        if key not in cache:
            ids = encode_prompt(tok, [{"role": "user", "content": user_text}])
            out = decode(model, ids, None, max_tokens, eos).tokens
            cache[key] = tok.decode(out, skip_special_tokens=True)
        return cache[key]

    return tok, greedy
