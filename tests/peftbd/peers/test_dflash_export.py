"""A head in vLLM's dflash format (`peftbd.peers.dflash_export`), checked without vLLM: the files,
the names vLLM's loader reads, the tensors equal to the head's, and the heads it refuses."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from peftbd.methods.bd_head import METHOD as HEAD
from peftbd.methods.dflash import METHOD as DFLASH
from peftbd.models.bd_head import BDHead
from peftbd.peers.dflash_export import ARCHITECTURE, MASK_FILE, DflashExportError, export_dflash


def test_the_dflash_head_exports_under_vllm_s_names(draft_ctx, tmp_path):
    head = DFLASH.load(draft_ctx, None)
    with torch.no_grad():  # distinct values, so a swapped tensor shows
        for p in head.parameters():
            p.copy_(torch.randn_like(p))
    out = export_dflash(head, draft_ctx.cfg.dflash.block_size, tmp_path / "draft", DFLASH.id)
    assert out.num_speculative_tokens == 15 and out.target_layer_ids == (0,)  # hidden_states[1]
    config = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURE] and config["block_size"] == 16
    assert config["dflash_config"] == {"target_layer_ids": [0], "mask_token_id": draft_ctx.mask_id}
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == head.config.hidden_size
    weights = load_file(str(tmp_path / "draft" / "model.safetensors"))
    ours = head.state_dict()
    assert torch.equal(weights.pop("fc.weight"), ours["project.weight"])
    assert torch.equal(weights.pop("hidden_norm.weight"), ours["context_norm.weight"])
    assert {k: v for k, v in ours.items() if k.startswith(("layers.", "norm."))}.keys() == weights.keys()
    assert all(torch.equal(v, ours[k]) for k, v in weights.items())
    # no embeddings or LM head (vLLM shares the verifier's); the mask embedding in its own file
    mask = torch.load(tmp_path / "draft" / MASK_FILE, weights_only=True)
    assert mask["mask_token_id"] == draft_ctx.mask_id and torch.equal(mask["embedding"], ours["mask_embedding"])


def test_what_vllm_s_format_has_no_place_for_is_refused_naming_each_field(draft_ctx, tmp_path):
    head = HEAD.load(draft_ctx, None)  # the head's recipe: its anchor fused, the final layer read
    with pytest.raises(DflashExportError) as info:
        export_dflash(head, 16, tmp_path / "head", HEAD.id)
    message = str(info.value)
    assert "peftbd_head.anchor_fusion=true" in message and "anchor_fusion=false" in message
    assert "peftbd_head.feature_layers=[1, 2] reads [2]" in message and "1..1" in message
    assert not (tmp_path / "head").exists()
    def dflash(**changes) -> BDHead:
        section = dataclasses.replace(draft_ctx.cfg.dflash, **changes)
        return DFLASH.load(dataclasses.replace(draft_ctx, cfg=draft_ctx.cfg.with_section("dflash", section)), None)

    # deeper heads export when their block is DFlash's (anchored: the first token sees the masks)
    assert export_dflash(dflash(layers=2), 16, tmp_path / "deep", DFLASH.id).target_layer_ids == (0,)
    with pytest.raises(DflashExportError, match=r"dflash.anchored=false with layers=2: .*anchored=true"):
        export_dflash(dflash(layers=2, anchored=False), 16, tmp_path / "unanchored", DFLASH.id)
    export_dflash(dflash(anchored=False), 16, tmp_path / "one", DFLASH.id)  # one layer: its drafts are alike
