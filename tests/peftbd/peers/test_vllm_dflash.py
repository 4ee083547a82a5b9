"""Our DFlash head in vLLM (needs vLLM: `bash scripts/install.sh --with-vllm`, which CI runs;
skipped with the reason where it is absent): a head overfit on a few greedy replies, exported to
vLLM's dflash format, drafts in vLLM as in our engine: the same outputs (greedy AR's) and the same
verifier steps, prompt by prompt."""

from __future__ import annotations

import pytest
import torch

from peftbd.benchmarking.peer import engine_load
from peftbd.benchmarking.peer_dflash import dflash_pair
from peftbd.config import EMBEDDED_TINY, load_config
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.decoding import SpeculativeDecoder
from peftbd.methods import DraftContext
from peftbd.models.bd_head import HEAD_SUBDIR
from peftbd.models.loading import eos_token_ids, load_tokenizer, model_dirs
from peftbd.peers.vllm_client import VllmPeer
from peftbd.peers.vllm_env import absent_reason
from peftbd.training.examples import collate_sequences
from peftbd.training.head_task import HeadTask

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(absent_reason() is not None, reason=str(absent_reason())),
]
PROMPTS, TOKENS = 4, 32


def test_vllm_drafts_with_our_exported_dflash_head_as_our_engine_does(tiny_world, tmp_path):
    cfg = load_config("tiny")
    tok = load_tokenizer(cfg)
    task = HeadTask(cfg, "dflash")
    head = task.build(torch.device("cpu"))
    verifier = task.verifier
    assert verifier is not None
    eos = eos_token_ids(verifier, tok)
    prompts = first_prompts(tok, resolve_source(cfg, EMBEDDED_TINY), PROMPTS, cfg.data.max_prompt_len)
    replies = [r.tokens for r in SpeculativeDecoder(verifier, None, eos, TOKENS).decode_many(prompts, PROMPTS)]
    batch = collate_sequences({"id": [str(i) for i in range(PROMPTS)], "prompt_ids": prompts,
                               "continuation_ids": replies, "prompt_len": list(map(len, prompts))},
                              pad_id=tok.pad_token_id)
    optimizer = torch.optim.AdamW(head.parameters(), lr=3e-3)
    for epoch in range(40):  # overfit on these replies: the head drafts them, mostly
        optimizer.zero_grad()
        task.train_loss(head, batch, epoch).backward()
        optimizer.step()
    head.eval()
    head.save_pretrained(tmp_path / "run" / HEAD_SUBDIR)
    ctx = DraftContext(cfg, verifier, tok.mask_token_id, tok.pad_token_id)
    load = engine_load(verifier, model_dirs(cfg)[1], cfg.model.dtype, prompts, TOKENS, "eager", cfg)
    with VllmPeer(tmp_path / "vllm.log") as peer:
        pair = dflash_pair(ctx, tmp_path / "run", tmp_path / "export", load, prompts, eos, TOKENS, 1,
                           peer, "eager")
    assert pair.ours.tokens_per_step > 1.5, pair  # it drafts: acceptance is there to compare
    assert pair.identical == PROMPTS
    assert (pair.vllm.steps, pair.vllm.tokens_per_step) == (pair.ours.steps, pair.ours.tokens_per_step)
    assert pair.within
    # per draft position: the same acceptances, vLLM's plus drafts it accepted past the budget
    ours, theirs = pair.ours_accepted_per_position, pair.vllm_accepted_per_position
    assert ours[0] > 0 and len(theirs) == len(ours) == 15
    assert all(t >= o for t, o in zip(theirs, ours)) and sum(theirs) - sum(ours) <= PROMPTS * 15
