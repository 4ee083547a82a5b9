"""The qwen3-0.6b preset's code path, end to end, at Qwen3-0.6B's vocabulary on CPU.

A stand-in checkpoint built here (random weights, bf16 safetensors; 151,936 rows, tied embeddings,
heads of 128 as Qwen3-0.6B's, but half its width: hidden 512, 8/4 heads, MLP 1536, and 2 of its 28
layers; Qwen3's own tokenizer, tests/qwen3_tokenizer.py) runs every stage's library code with the
preset's settings and `model.device=cpu`: generate's batched greedy continuations in bf16, both
training tasks under DeepSpeed ZeRO-2 (the preset's; in fp32 here, see OVERRIDES) with
micro-batching and chunked logits, their eval, checkpoints and exports, then the benchmark's timing
shard (every arm, the greedy audit). It catches what the tiny world's 2,048-row vocabulary hides:
vocabulary-sized tensors in checkpoints, in the loss, in memory; and Qwen3's real token ids (the
mask token the project adds is id 151,669, inside the 151,936 rows).
What it does not run: the Ray orchestration around these calls (jobs/), tested on tiny.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from peftbd.benchmarking.arms import DrafterDirs, arm_specs
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.runner import run_shard
from peftbd.config import load_config
from peftbd.data.continuations import greedy_continuations
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.manifest import peak_rss_mib
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.training.checkpoint import TrainState, save_checkpoint
from peftbd.training.deepspeed_config import batch_plan
from peftbd.training.evaluate import evaluate
from peftbd.training.examples import collate_sequences
from peftbd.methods import method

from .conftest import QWEN3_VOCAB, qwen3_stand_in

# Small on purpose: on a 2-core CPU one LM-head call over the 151,936 x 512 table takes ~0.25 s
# (it reads 156 MB) and so does each of peft's copies of it; half the width halves them, and the
# fp32 table (311 MB) still outgrows the memory check's 256 MiB slack below.
NEW_TOKENS = 12
OVERRIDES = [
    "model.device=cpu",  # the one flag: no GPU request anywhere, bf16 as the preset says
    "data.max_prompt_len=64", f"data.max_new_tokens={NEW_TOKENS}",
    "peftbd.early_exit_layers=0", "peftbd.offsets_ablation=false",
    "peftbd.optim.global_batch_size=4", "fastmtp.optim.global_batch_size=4",
    "peftbd.optim.max_steps=1", "fastmtp.optim.max_steps=1",
    "peftbd_head.optim.global_batch_size=4", "peftbd_head.optim.max_steps=1",
    "dflash.optim.global_batch_size=4", "dflash.optim.max_steps=1", "dflash.layers=1",
    "peftbd_head.feature_layers=[1,2]",  # the stand-in has 2 of the 28 layers
    "training.micro_batch_size=2",  # 2 micro-batches of 2 per step (gradient accumulation)
    "training.logits_chunk_rows=16",  # several chunks per micro-batch
    # Training in fp32 here: bf16 trains on CPU (test_checkpoint runs ZeRO-2 bf16 steps), but
    # without AVX512-BF16 torch's backward GEMMs take its generic kernel (minutes per step here)
    "training.precision=fp32",
    "decoding.max_new_tokens=6", "decoding.num_prompts=1", "decoding.repeats=1",
    "decoding.torch_threads=1",
]


@pytest.fixture(scope="module")
def stand_in(qwen3_tokenizer_dir, tmp_path_factory):
    """A checkpoint dir of Qwen3-0.6B's vocabulary (half its width, 2 layers) with Qwen3's
    tokenizer, in bf16."""
    path = tmp_path_factory.mktemp("qwen3-stand-in")
    qwen3_stand_in(hidden=512, layers=2, intermediate=1536, heads=8, kv_heads=4,
                   head_dim=128).to(torch.bfloat16).save_pretrained(path)
    for f in qwen3_tokenizer_dir.iterdir():
        shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="module")
def corpus(tiny_world, tmp_path_factory):
    """The tiny corpus's first rows as a TULU-schema .jsonl (the preset's own tiny_world section
    is not the cached world's)."""
    path = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    path.write_text("\n".join(tiny_world.corpus_path.read_text().splitlines()[:200]) + "\n")
    return path


@pytest.fixture(scope="module")
def cfg(stand_in, corpus):
    cfg = load_config("qwen3-0.6b", overrides=[*OVERRIDES, f"model.name_or_path={stand_in}",
                                                f"data.source={corpus}"])
    assert (cfg.model.dtype, cfg.training.zero_stage) == ("bfloat16", 2)
    assert not cfg.training.use_gpu and cfg.generate.num_gpus_per_actor == 0
    assert cfg.decoding.worker_num_gpus == 0
    return cfg


@pytest.fixture(scope="module")
def artifact(cfg):
    """Generate's compute: the verifier's batched greedy continuations of corpus prompts."""
    tok, model = load_tokenizer(cfg), load_verifier(cfg)
    assert model.get_input_embeddings().num_embeddings == QWEN3_VOCAB
    assert (tok.pad_token_id, tok.mask_token_id, len(tok)) == (151_643, 151_669, 151_670)
    assert next(model.parameters()).dtype == torch.bfloat16  # bf16 runs on CPU when asked
    prompts = first_prompts(tok, resolve_source(cfg), 6, cfg.data.max_prompt_len)
    outs = greedy_continuations(model, prompts, NEW_TOKENS, eos_token_ids(model, tok))
    rows = {"id": [f"r{i}" for i in range(len(prompts))], "prompt_ids": prompts,
            "continuation_ids": [o.ids for o in outs], "prompt_len": [len(p) for p in prompts]}
    assert all(len(o.ids) > 0 for o in outs)
    return rows, tok.pad_token_id


def _train(kind, cfg, artifact, ds_engine, out):
    rows, pad_id = artifact
    task = method(kind).task(cfg)
    engine = ds_engine(task.build(torch.device("cpu")), cfg, task.optim)
    module = engine.module
    assert next(module.parameters()).dtype == torch.float32  # training.precision, CPU or not
    plan = batch_plan(cfg.training, task.optim, 1)
    assert (plan.micro_batch, plan.accumulation) == (2, 2)
    trainable, total = task.parameter_counts(module)
    estimate = task.step_memory(module.config, trainable, total, plan, "float32")
    before = peak_rss_mib()
    for step in range(task.optim.max_steps):
        for m in range(plan.accumulation):
            i = 2 * m  # rows 0-3 train, 4-5 evaluate
            batch = collate_sequences({k: v[i : i + 2] for k, v in rows.items()}, pad_id)
            loss = task.train_loss(module, batch, epoch=0)
            assert torch.isfinite(loss)
            engine.backward(loss)
            engine.step()
    step_growth = peak_rss_mib() - before
    metrics = evaluate(task, module, [collate_sequences({k: v[4:] for k, v in rows.items()}, pad_id)])
    assert metrics["eval_loss"] > 0 and 0 <= metrics["eval_target_token_accuracy"] <= 1
    save_checkpoint(engine, out / "ckpt", TrainState(step=2), "fp")
    ckpt_bytes = sum(f.stat().st_size for f in (out / "ckpt").rglob("*") if f.is_file())
    task.export(module, out)
    return trainable, ckpt_bytes, estimate, step_growth


@pytest.mark.slow
def test_the_preset_runs_end_to_end_at_the_real_vocabulary(cfg, artifact, ds_engine, tmp_path):
    results = {}
    for kind in ("peftbd", "fastmtp", "peftbd_head", "dflash"):
        trainable, ckpt_bytes, estimate, growth = _train(kind, cfg, artifact, ds_engine, tmp_path / kind)
        # only what trains is saved: 12 bytes per trainable parameter under ZeRO-2 fp32 (weights,
        # AdamW moments), nothing of the 311 MB fp32 table
        assert ckpt_bytes < 16 * trainable + 2**20, (kind, ckpt_bytes, trainable)
        # training's growth of the process peak stays within the estimate's step memory beyond
        # the weights (already resident): no vocabulary-sized surprise
        assert growth < estimate.total_mib - estimate.weights_mib + 256, (kind, growth, estimate)
        results[kind] = (trainable, ckpt_bytes, estimate.total_mib, round(growth))
    rows, _ = artifact
    prompts = [Prompt(f"p{i}", rows["prompt_ids"][4 + i]) for i in range(cfg.decoding.num_prompts)]
    dirs = DrafterDirs({f"train_{kind}": str(tmp_path / kind) for kind in results},
                       draft_vocab=list(range(cfg.peftbd_head.draft_vocab)))
    shard = run_shard(cfg, dirs, arm_specs(cfg), prompts, repeats=1)
    assert shard.dtype == "bfloat16" and shard.device == "cpu"  # what the report states
    assert set(shard.results) == {s.id for s in arm_specs(cfg)}
    assert all(not found for found in shard.mismatches.values()), shard.mismatches  # greedy audit
    print("\nqwen3 stand-in (trainable, checkpoint bytes, estimate MiB, step RSS growth MiB):",
          results, f"benchmark worker peak RSS {shard.peak_rss_mib} MiB")
