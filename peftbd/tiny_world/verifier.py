"""The tiny Qwen3-architecture verifier: config and a brief, deterministic causal-LM training."""

from __future__ import annotations

import logging
import math
import random
from collections import Counter
from dataclasses import dataclass

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from peftbd import progress
from peftbd.config import TinyWorldConfig

log = logging.getLogger(__name__)


def tiny_qwen3_config(tw: TinyWorldConfig, vocab_size: int, eos_ids: list[int], pad_id: int) -> Qwen3Config:
    """A few-layer Qwen3 config (GQA, q/k norm, tied embeddings) for the embedded world."""
    return Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=tw.hidden_size,
        intermediate_size=tw.intermediate_size,
        num_hidden_layers=tw.num_layers,
        num_attention_heads=tw.num_heads,
        num_key_value_heads=tw.num_kv_heads,
        head_dim=tw.head_dim,
        max_position_embeddings=tw.max_position_embeddings,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        eos_token_id=eos_ids,
        pad_token_id=pad_id,
        bos_token_id=None,
    )


@dataclass(frozen=True)
class Example:
    """A conversation's token ids; the first `prompt_len` (the prompt) are context only: the
    verifier learns to reply, as supervised fine-tuning does, not to predict its prompts."""

    ids: list[int]
    prompt_len: int

    @property
    def reply(self) -> list[int]:
        return self.ids[self.prompt_len:]


def _batch(examples: list[Example], pad_id: int, max_len: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = [e.ids[:max_len] for e in examples]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for i, (e, s) in enumerate(zip(examples, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, e.prompt_len : len(s)] = torch.tensor(s[e.prompt_len:])
    return ids, labels


@torch.no_grad()
def mean_loss(model: Qwen3ForCausalLM, examples: list[Example], pad_id: int, batch_size: int = 32) -> float:
    """Mean next-token cross-entropy (nats per predicted reply token) over `examples`."""
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(examples), batch_size):
        ids, labels = _batch(examples[i : i + batch_size], pad_id)
        logits = model(input_ids=ids, attention_mask=(ids != pad_id).long()).logits
        tgt = labels[:, 1:]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1), tgt.flatten(), ignore_index=-100, reduction="sum"
        )
        total += loss.item()
        count += int((tgt != -100).sum())
    return total / max(count, 1)


def unigram_cross_entropy(train: list[Example], heldout: list[Example], vocab_size: int) -> float:
    """Cross-entropy (nats per token) of held-out reply tokens under the add-one unigram of the
    training replies."""
    counts = Counter(t for e in train for t in e.reply)
    total = sum(counts.values()) + vocab_size
    tokens = [t for e in heldout for t in e.reply]
    return -sum(math.log((counts[t] + 1) / total) for t in tokens) / max(len(tokens), 1)


BUCKET_BATCHES = 16
"""Batches per length bucket: an epoch's shuffled rows are cut into windows of this many
batches, each sorted by length before it is split, so a batch pads to similar lengths."""


def length_bucketed_batches(lengths: list[int], batch_size: int, rng: random.Random) -> list[list[int]]:
    """One epoch of row indices in batches of `batch_size` (the last may be smaller) whose rows
    have similar lengths, in random order; deterministic from `rng`'s state."""
    order = rng.sample(range(len(lengths)), len(lengths))
    window = batch_size * BUCKET_BATCHES
    batches = []
    for i in range(0, len(order), window):
        part = sorted(order[i : i + window], key=lambda j: lengths[j])
        batches += [part[k : k + batch_size] for k in range(0, len(part), batch_size)]
    rng.shuffle(batches)
    return batches


HELDOUT_EVERY = 100
"""Steps between held-out loss checks when training to `tiny_world.heldout_loss_target`."""


def train_tiny_verifier(
    tw: TinyWorldConfig, config: Qwen3Config, train: list[Example], heldout: list[Example],
    pad_id: int,
) -> tuple[Qwen3ForCausalLM, int]:
    """Train from scratch with AdamW and cosine decay over `tw.train_steps` batches of similar
    lengths (`length_bucketed_batches`), stopping early once the loss on `heldout` is at most
    `tw.heldout_loss_target` (> 0; checked every HELDOUT_EVERY steps: worlds of other shapes
    trained to the same recall); deterministic from seed. Returns the model and its steps."""
    torch.manual_seed(tw.seed)
    model = Qwen3ForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=tw.lr, weight_decay=0.01, betas=(0.9, 0.95))
    warmup = max(1, tw.train_steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: min(1.0, (s + 1) / warmup)
        * 0.5 * (1 + math.cos(math.pi * min(s, tw.train_steps) / tw.train_steps)),
    )
    rng = random.Random(tw.seed)
    batches: list[list[int]] = []
    model.train()
    for step in range(tw.train_steps):
        if not batches:
            batches = length_bucketed_batches([len(e.ids) for e in train], tw.train_batch_size, rng)
        ids, labels = _batch([train[j] for j in batches.pop()], pad_id, tw.train_seq_len)
        out = model(input_ids=ids, attention_mask=(ids != pad_id).long(), labels=labels)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % 10 == 0 or step == tw.train_steps - 1:
            progress.report(step + 1, tw.train_steps, loss=out.loss.item())
        if step % 100 == 0 or step == tw.train_steps - 1:
            log.info("tiny verifier step %d/%d loss %.3f", step + 1, tw.train_steps, out.loss.item())
        if tw.heldout_loss_target > 0 and (step + 1) % HELDOUT_EVERY == 0:
            loss = mean_loss(model, heldout, pad_id)
            model.train()
            log.info("tiny verifier step %d held-out loss %.3f (target %.3f)", step + 1, loss,
                     tw.heldout_loss_target)
            if loss <= tw.heldout_loss_target:
                return model.eval(), step + 1
    model.eval()
    return model, tw.train_steps
