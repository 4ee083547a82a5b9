"""The FastMTP head: own weights only, teacher forcing == cached decoding, save/load round trip."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from peftbd.models.loading import load_verifier
from peftbd.models.mtp_head import HEAD_SUBDIR, MTPHead
from peftbd.models.peft_bd import count_parameters



@pytest.fixture(scope="module")
def verifier(tiny_cfg):
    return load_verifier(tiny_cfg)


@pytest.fixture(scope="module")
def head(verifier):
    torch.manual_seed(0)
    return MTPHead(verifier).eval()


IDS = torch.tensor([[5, 17, 300, 21, 42, 99, 64, 7, 1000, 12]])


@torch.no_grad()
def _hidden(verifier) -> torch.Tensor:
    return verifier.model(input_ids=IDS).last_hidden_state


def test_head_owns_only_its_own_weights(verifier, head):
    d = verifier.config.hidden_size
    names = set(head.state_dict())
    assert not any("embed" in n and "norm" not in n or "lm_head" in n for n in names)
    layer = sum(p.numel() for p in head.layer.parameters())
    assert count_parameters(head) == (2 * d + 2 * d * d + layer, 2 * d + 2 * d * d + layer)
    assert sum(p.numel() for p in verifier.parameters() if p.requires_grad) == 0


@torch.no_grad()
def test_teacher_forcing_equals_cached_decoding(verifier, head):
    h = _hidden(verifier)
    n = IDS.shape[1]
    pos = torch.arange(1, n)[None]
    full = head(h[:, :-1], IDS[:, 1:], pos)
    assert full.logits.shape == (1, n - 1, verifier.config.vocab_size)
    cache = DynamicCache()
    parts = [head(h[:, a:b], IDS[:, a + 1 : b + 1], pos[:, a:b], cache=cache) for a, b in ((0, 4), (4, 5), (5, n - 1))]
    assert cache.get_seq_length() == n - 1
    torch.testing.assert_close(torch.cat([p.logits for p in parts], 1), full.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([p.hidden for p in parts], 1), full.hidden, atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_save_and_load_round_trip(verifier, head, tmp_path):
    for p in head.parameters():
        p.add_(0.01)
    head.save_pretrained(tmp_path / HEAD_SUBDIR)
    h, pos = _hidden(verifier), torch.arange(1, IDS.shape[1])[None]
    for where in (tmp_path / HEAD_SUBDIR, tmp_path):  # the head's dir, or a training run's out dir
        loaded = MTPHead.from_pretrained(where, verifier)
        assert torch.equal(loaded(h[:, :-1], IDS[:, 1:], pos).logits,
                           head(h[:, :-1], IDS[:, 1:], pos).logits)


def test_load_rejects_a_different_verifier(tiny_cfg, head, tmp_path):
    head.save_pretrained(tmp_path / "mtp")
    other = load_verifier(tiny_cfg)
    other.config.intermediate_size += 1  # a verifier of another shape
    with pytest.raises(ValueError, match="verifier shape"):
        MTPHead.from_pretrained(tmp_path / "mtp", other)
    with pytest.raises(FileNotFoundError, match="peftbd_head_dir"):
        MTPHead.from_pretrained(tmp_path / "nothing", other)
