"""The PEFT-BD adapter: attach/load, the cheap on/off switch, the shared draft attention pattern."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from peftbd.models.loading import load_tokenizer, load_verifier
from peftbd.models.peft_bd import (
    adapter_on,
    attach_drafter_adapter,
    count_parameters,
    draft_attention_mask,
    draft_embeddings,
    draft_input_ids,
    draft_logits,
    draft_position_ids,
    draft_visibility,
    load_drafter_adapter,
    set_adapter_enabled,
)



@pytest.fixture(scope="module")
def mask_id(tiny_cfg) -> int:
    return load_tokenizer(tiny_cfg).mask_token_id


def _perturbed_drafter(cfg, mask_id: int):
    """A drafter whose adapter changes the outputs (fresh LoRA B is zero, the mask row is original)."""
    torch.manual_seed(0)  # LoRA A is initialised from the global RNG
    model = attach_drafter_adapter(load_verifier(cfg), cfg.peftbd, mask_id)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="module")
def drafter(tiny_cfg, mask_id):
    return _perturbed_drafter(tiny_cfg, mask_id)


IDS = torch.tensor([[5, 17, 300, 21, 42, 99, 64, 7]])


@torch.no_grad()
def _logits(model, ids=IDS):
    return model(input_ids=ids).logits


def test_switch_off_is_bit_identical_to_disable_adapter_and_base(tiny_cfg, drafter, mask_id):
    ids = torch.cat([IDS, torch.tensor([[mask_id]])], dim=1)  # the mask row is adapted too
    base = _logits(load_verifier(tiny_cfg), ids)
    set_adapter_enabled(drafter, True)
    on = _logits(drafter, ids)
    with drafter.disable_adapter():
        ctx_off = _logits(drafter, ids)
    set_adapter_enabled(drafter, False)
    off = _logits(drafter, ids)
    assert not torch.equal(on[:, -1], base[:, -1])  # the adapter really changes outputs
    assert torch.equal(off, ctx_off)
    assert torch.equal(off, base)
    with adapter_on(drafter):
        assert torch.equal(_logits(drafter, ids), on)
    assert torch.equal(_logits(drafter, ids), base)  # adapter_on restores verifier mode


def test_trainable_parameters_are_lora_plus_one_mask_row(tiny_cfg, mask_id):
    model = attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, mask_id)
    trainable, total = count_parameters(model)
    c, r = model.config, tiny_cfg.peftbd.lora_r
    d, q, kv, ff = c.hidden_size, c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim, c.intermediate_size
    per_layer = r * ((d + q) * 2 + (d + kv) * 2 + (d + ff) * 3)  # q,o ; k,v ; gate,up,down
    assert trainable == c.num_hidden_layers * per_layer + d  # + the tied mask-token row, once
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all("lora_" in n or "trainable_tokens_delta" in n for n in names)
    assert total > trainable


def test_save_and_load_round_trip(tiny_cfg, drafter, mask_id, tmp_path):
    drafter.save_pretrained(tmp_path / "adapter")
    loaded = load_drafter_adapter(load_verifier(tiny_cfg), tmp_path / "adapter")
    with adapter_on(drafter), adapter_on(loaded):
        assert torch.equal(_logits(loaded), _logits(drafter))
    assert torch.equal(_logits(loaded), _logits(drafter))
    run_dir = load_drafter_adapter(load_verifier(tiny_cfg), tmp_path)  # a training run's out dir
    with adapter_on(drafter), adapter_on(run_dir):
        assert torch.equal(_logits(run_dir), _logits(drafter))
    with pytest.raises(FileNotFoundError, match="peftbd_dir"):
        load_drafter_adapter(load_verifier(tiny_cfg), tmp_path / "missing")


def test_visibility_pattern():
    v = draft_visibility(cache_len=2, block_size=3, anchored=False)
    assert v.tolist() == [
        [True, True, True, False, False, False],
        [True, True, True, True, True, True],
        [True, True, True, True, True, True],
        [True, True, True, True, True, True],
    ]
    assert draft_visibility(2, 3, anchored=True).all()
    m = draft_attention_mask(2, 3, False, torch.float32)
    assert m.shape == (1, 1, 4, 6)
    assert m[0, 0, 0, 3] == torch.finfo(torch.float32).min and m[0, 0, 1, 5] == 0
    assert draft_input_ids(9, 3, 3).tolist() == [[9, 3, 3, 3]]
    assert draft_position_ids(2, 3).tolist() == [[2, 3, 4, 5]]


@torch.no_grad()
def _draft_logits(model, context, chunk, anchored: bool):
    """Adapter-on chunk logits over the adapter-off cache of `context`."""
    cache = DynamicCache()
    model(input_ids=context, cache=cache)
    n, block = context.shape[1], chunk.shape[1] - 1
    with adapter_on(model):
        out = model(
            input_ids=chunk, cache=cache, position_ids=draft_position_ids(n, block),
            attention_mask=draft_attention_mask(n, block, anchored, torch.float32),
        )
    assert cache.get_seq_length() == n + block + 1
    return out.logits


def test_draft_chunk_attends_as_documented(drafter):
    context, b = IDS[:, :6], 11
    chunk = draft_input_ids(b, 3, 4)  # any filler id works for the attention-pattern checks
    other = chunk.clone()
    other[0, 4] = 500  # change the last block position
    for anchored in (False, True):
        a = _draft_logits(drafter, context, chunk, anchored)
        c = _draft_logits(drafter, context, other, anchored)
        assert not torch.allclose(a[0, 1], c[0, 1])  # masks see each other (bidirectional)
        assert torch.equal(a[0, 0], c[0, 0]) != anchored  # b sees the block only when anchored
    # unanchored b is plain causal context: same as an adapter-on causal step over the cache
    cache = DynamicCache()
    with torch.no_grad():
        drafter(input_ids=context, cache=cache)
        with adapter_on(drafter):
            causal = drafter(input_ids=chunk[:, :1], cache=cache).logits
    # a 5-row chunk's linears and a 1-row step's may run different CPU kernels (a decoder built
    # on this model prepacks its weights: peftbd.models.cpu_linear), so equal up to rounding; a
    # wrong attention pattern moves the logits by O(1)
    torch.testing.assert_close(_draft_logits(drafter, context, chunk, False)[0, 0], causal[0, 0],
                               atol=1e-4, rtol=1e-4)


def test_eager_attention_gives_the_same_draft(tiny_cfg, mask_id):
    sdpa = _perturbed_drafter(tiny_cfg, mask_id)
    from peftbd.config import apply_override

    eager = _perturbed_drafter(apply_override(tiny_cfg, "model.attn_implementation=eager"), mask_id)
    chunk = draft_input_ids(11, mask_id, 4)
    for anchored in (False, True):
        torch.testing.assert_close(
            _draft_logits(eager, IDS, chunk, anchored), _draft_logits(sdpa, IDS, chunk, anchored),
            atol=1e-4, rtol=1e-4,
        )


def test_attached_and_loaded_adapters_rest_switched_off(tiny_cfg, mask_id, tmp_path):
    """At rest the wrapped model must be the verifier: AR/verify passes never see the adapter."""
    ids = torch.tensor([[5, 17, 300, 21, 42]])
    ref = load_verifier(tiny_cfg)(ids).logits
    peft_model = attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, mask_id)
    for p in peft_model.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.5)  # a non-trivial adapter
    assert torch.equal(peft_model(ids).logits, ref)
    peft_model.save_pretrained(tmp_path / "adapter")
    loaded = load_drafter_adapter(load_verifier(tiny_cfg), tmp_path / "adapter")
    assert torch.equal(loaded(ids).logits, ref)
    with adapter_on(loaded):
        assert not torch.equal(loaded(ids).logits, ref)


@torch.no_grad()
def test_draft_embeddings_and_logits_equal_the_wrapped_layers_where_drafts_read_them(drafter, mask_id):
    """The draft path's copy-free embedding gather and base-head logits give the adapter-on values
    bit for bit (the mask-token column aside, which no draft proposes)."""
    base = drafter.get_base_model()
    chunk = torch.tensor([[5, mask_id, mask_id, 17, mask_id]])
    with adapter_on(drafter):
        wrapped = base.get_input_embeddings()(chunk)
        assert torch.equal(draft_embeddings(base, chunk), wrapped)
        hidden = torch.randn(1, 5, base.config.hidden_size, generator=torch.Generator().manual_seed(1))
        full, ours = base.lm_head(hidden), draft_logits(base, hidden)
    assert not torch.equal(wrapped[0, 1], base.get_input_embeddings()(chunk)[0, 1])  # row trained
    keep = torch.arange(full.shape[-1]) != mask_id
    assert torch.equal(ours[..., keep], full[..., keep])
