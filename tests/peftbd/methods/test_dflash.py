"""DFlash, registered once (`peftbd.methods.dflash`): its names, stage, task, arm, the drafter
over a loaded head, and the cost profile's three depths at Qwen3-0.6B's shape."""

from __future__ import annotations

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from peftbd.config import load_config
from peftbd.decoding import BDHeadDrafter
from peftbd.layout import benchmark_stage, stages
from peftbd.methods.bd_head import TRAIN_HEAD
from peftbd.methods.dflash import TRAIN_DFLASH
from peftbd.methods import DraftContext, method, by_serving, method, methods
from peftbd.methods import dflash
from peftbd.models.bd_head import BDHead
from peftbd.training.head_task import HeadTask

DFLASH = dflash.METHOD


def test_dflash_is_registered_after_the_head_with_its_stage():
    ids = [m.id for m in methods()]
    assert ids.index("dflash") == ids.index("peftbd_head") + 1
    assert method("dflash") is by_serving("dflash") is method("dflash") is DFLASH
    assert (DFLASH.section, DFLASH.dir_arg, DFLASH.ships) == ("dflash", "dflash_dir", "features")
    assert DFLASH.stage is TRAIN_DFLASH and TRAIN_DFLASH.subdir == "dflash"
    assert TRAIN_DFLASH.command == "python -m jobs.train --method dflash"
    assert stages().index(TRAIN_DFLASH) == stages().index(TRAIN_HEAD) + 1
    assert TRAIN_DFLASH in benchmark_stage().inputs


def test_its_arm_and_positions_follow_the_dflash_section():
    cfg = load_config("qwen3-0.6b")
    [arm] = DFLASH.arms(cfg)
    assert (arm.id, arm.method, arm.stage) == ("dflash", "dflash", TRAIN_DFLASH.name)
    assert arm.label == "DFlash head D=16, 5 layers"
    assert DFLASH.positions(cfg) == 15  # D - 1
    # the run's own depth (5) is the arm the report projects with this run's acceptance
    assert [a.id for a in DFLASH.cost_arms(cfg)] == ["dflash_1layer", "dflash_2layers", "dflash"]
    assert [a.stage for a in DFLASH.cost_arms(cfg)] == [
        f"{TRAIN_DFLASH.name}@{k}" for k in (1, 2, 5)]


def test_its_task_load_and_drafter_read_the_dflash_section(draft_ctx, tmp_path):
    task = DFLASH.task(draft_ctx.cfg)
    assert isinstance(task, HeadTask) and task.head_cfg == draft_ctx.cfg.dflash
    head = DFLASH.load(draft_ctx, None)
    assert isinstance(head, BDHead) and head.shape.block_masks == "block_minus_one"
    assert head.shape.feature_layers == (1,)  # 1 head layer on the 2-layer verifier
    # DFlash embeds the block's first token plainly: no fusion weights, the verifier's row
    assert not head.shape.anchor_fusion and not any("fuse" in k or "anchor" in k for k in head.state_dict())
    ids = torch.tensor([[7, draft_ctx.mask_id, draft_ctx.mask_id]])
    x = head.embed(ids, torch.zeros(1, 1, head.config.hidden_size))
    assert torch.equal(x[0, 0], draft_ctx.verifier.get_input_embeddings().weight[7])
    head.save_pretrained(tmp_path / "bd_head")
    loaded = DFLASH.load(draft_ctx, tmp_path)  # a training run's output dir
    assert loaded.shape == head.shape
    [arm] = DFLASH.arms(draft_ctx.cfg)
    drafter = DFLASH.drafter(loaded, draft_ctx, arm)
    assert isinstance(drafter, BDHeadDrafter) and drafter.block_size == 15


def test_the_profile_builds_one_untrained_head_per_depth_at_qwen3_0_6b_shape():
    """At Qwen3-0.6B's depth and width (a meta-device verifier: no weights), each depth reads its
    own DFlash feature layers."""
    cfg = load_config("qwen3-0.6b")
    with torch.device("meta"):
        verifier = Qwen3ForCausalLM(Qwen3Config(
            vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True))
    modules = DFLASH.profile(DraftContext(cfg, verifier, mask_id=151_669, pad_id=0))
    assert list(modules) == [f"{TRAIN_DFLASH.name}@{k}" for k in (1, 2, 5)]
    shapes = {key: (len(m.layers), m.shape.feature_layers) for key, m in modules.items()}
    assert list(shapes.values()) == [(1, (15,)), (2, (2, 26)), (5, (2, 8, 14, 20, 26))]
    assert all(not m.training and m.shape.drafted(16) == 15 for m in modules.values())
