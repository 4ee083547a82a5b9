"""What one training step needs in memory on one worker: an estimate from the config and the
model's shape (recorded in the training manifest beside the workers' measured peaks).

An estimate, not a measurement: it counts the tensors a step keeps at its peak (weights,
gradients, optimizer state, the activations autograd saves for one micro-batch at the longest
sequence, the clean KV, peft's per-forward copies of the embedding table, one chunk of logits)
and leaves out allocator fragmentation, the CUDA context (~0.5 GiB) and library memory.

Activations per token and trained decoder layer (Qwen3: RMSNorm in fp32, LoRA on all seven
projections, SDPA's memory-efficient kernel, which keeps q, k, v and the output only):

- each RMSNorm (input, post-attention, q_norm, k_norm) keeps its fp32 input and its normalized
  output: (4 + b) bytes per element, over 2h + q + kv elements;
- linear inputs the norms do not hold (o_proj's, down_proj's and one of the norm outputs per
  projection group): b (2h + q + I);
- RoPE'd q and k: b (q + kv); attention's q, k, v and output: b (2q + 2kv);
- the MLP's gate, its activation and up: 3 b I; LoRA's r-wide intermediates: 7 b r;

with h hidden, q = heads x head_dim, kv = kv heads x head_dim, I intermediate, b the training
dtype's bytes. At Qwen3-0.6B in bf16 that is ~80 KB per token and layer; on CPU in fp32 the
formula gives 2.7 GB for one 768-token PEFT-BD row with unchunked logits (the issue measured 2.47).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from peftbd.config import Config, HeadConfig
from peftbd.manifest import WorkerPeaks
from peftbd.training.deepspeed_config import BatchPlan

log = logging.getLogger(__name__)
MIB = 2**20
FP32 = 4
LOGIT_BYTES = 4 + 4 + 4  # per logit of a chunk beyond its own dtype: fp32 copy, log-softmax, top-1 copy
LOGIT_BACKWARD_BYTES = 4  # the fp32 gradient of the log-softmax's input (recomputation included)


@dataclass(frozen=True)
class ModelShape:
    """The verifier dimensions a step's memory depends on."""

    vocab: int
    hidden: int
    layers: int
    intermediate: int
    q_dim: int
    kv_dim: int

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        """From a transformers config (Qwen3's fields)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(vocab=config.vocab_size, hidden=config.hidden_size,
                   layers=config.num_hidden_layers, intermediate=config.intermediate_size,
                   q_dim=config.num_attention_heads * head_dim,
                   kv_dim=config.num_key_value_heads * head_dim)

    def activation_bytes_per_token(self, dtype_bytes: int, lora_r: int) -> int:
        """Bytes one decoder layer saves for backward per token (see module doc)."""
        h, q, kv, i, b = self.hidden, self.q_dim, self.kv_dim, self.intermediate, dtype_bytes
        norms = (FP32 + b) * (2 * h + q + kv)
        linears = b * (2 * h + q + i)
        attention = b * (q + kv) + b * (2 * q + 2 * kv)
        mlp = 3 * b * i
        return norms + linears + attention + mlp + 7 * b * lora_r


@dataclass(frozen=True)
class StepMemory:
    """One training step's estimated peak on one worker, in MiB (see module doc)."""

    weights_mib: float  # every parameter the step reads (the frozen verifier's too), at the dtype
    gradients_mib: float  # trainable gradients: the dtype's plus DeepSpeed's fp32 copy under bf16
    optimizer_mib: float  # AdamW moments (+ fp32 master weights under bf16), over ZeRO's partitions
    activations_mib: float  # saved for backward by one micro-batch, plus the clean KV (PEFT-BD)
    table_copies_mib: float  # peft's merged embedding table and its gradient (PEFT-BD)
    logits_mib: float  # one chunk of logits with its loss intermediates and gradient
    total_mib: float
    micro_batch: int
    sequence_tokens: int  # the longest sequence (prompt + continuation)
    logits_rows: int  # positions per logits chunk (the whole micro-batch's when unchunked)
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def estimate_step_memory(
    kind: str, shape: ModelShape, *, trainable: int, total: int, dtype: str, micro_batch: int,
    sequence_tokens: int, continuation_tokens: int, chunk_rows: int, world_size: int,
    zero_stage: int, block_size: int = 0, draft_layers: int = 0, lora_r: int = 0,
    mtp_steps: int = 0, head_layers: int = 0, head_features: int = 0, head_anchors: int = 0,
) -> StepMemory:
    """The estimate for a `kind` step ("adapter": a LoRA block drafter on the backbone; "head": a
    block-diffusion head on the frozen backbone's features; "mtp": an MTP head) of `micro_batch` sequences of
    `sequence_tokens` (of which `continuation_tokens` continuation), `total` parameters at
    `dtype` of which `trainable` train, logits `chunk_rows` positions at a time (0: all)."""
    b = 2 if dtype in ("bfloat16", "float16") else FP32
    bf16 = b == 2
    partitions = world_size if zero_stage >= 1 else 1
    optimizer = trainable * (2 * FP32 + (FP32 if bf16 else 0)) / partitions
    gradients = trainable * (b + (FP32 if bf16 else 0)) / (world_size if zero_stage >= 2 else 1)
    per_token = shape.activation_bytes_per_token(b, lora_r)
    if kind in ("adapter", "head"):
        # blocks per row: one every D positions, or up to `head_anchors` random ones (DFlash's)
        blocks = (min(head_anchors, continuation_tokens) if head_anchors
                  else math.ceil(continuation_tokens / block_size))
        chunk_tokens = blocks * (block_size + 1)  # every block's [x_{s-1}, D positions]
        layers = head_layers if kind == "head" else draft_layers or shape.layers
        activations = micro_batch * chunk_tokens * per_token * layers
        activations += micro_batch * sequence_tokens * 2 * shape.kv_dim * b * layers  # context KV
        activations += micro_batch * chunk_tokens * (sequence_tokens + chunk_tokens) * b  # 4D mask
        # the head: the verifier's features and their projection, per position
        activations += micro_batch * sequence_tokens * (head_features + 2) * shape.hidden * b
        copies = 2 * shape.vocab * shape.hidden * b if kind == "adapter" else 0
        scored = micro_batch * continuation_tokens  # at t = 1 every block position is scored
        extra = b if kind == "adapter" else 0  # adapted_logits' copy with the mask column in place
    else:
        # each step: the head's one decoder layer plus its two input norms and the 2h projection
        step = per_token + (FP32 + b) * 2 * shape.hidden + b * 2 * shape.hidden
        activations = mtp_steps * micro_batch * sequence_tokens * step
        activations += micro_batch * sequence_tokens * shape.hidden * b  # the verifier's hidden
        copies = 0
        scored = mtp_steps * micro_batch * continuation_tokens
        extra = 0
    rows = min(chunk_rows, scored) if chunk_rows else scored
    per_logit = b + extra + LOGIT_BYTES + LOGIT_BACKWARD_BYTES
    logits = rows * shape.vocab * per_logit
    if not chunk_rows:  # unchunked: autograd keeps every log-softmax output until backward
        logits = scored * shape.vocab * (b + extra + 4) + rows * shape.vocab * LOGIT_BACKWARD_BYTES
    parts = {"weights_mib": total * b, "gradients_mib": gradients, "optimizer_mib": optimizer,
             "activations_mib": activations, "table_copies_mib": copies, "logits_mib": logits}
    mib = {k: round(v / MIB, 1) for k, v in parts.items()}
    return StepMemory(**mib, total_mib=round(sum(parts.values()) / MIB, 1), micro_batch=micro_batch,
                      sequence_tokens=sequence_tokens, logits_rows=rows, dtype=dtype)


def step_memory(kind: str, cfg: Config, model_config: Any, trainable: int, total: int,
                plan: BatchPlan, dtype: str, head: HeadConfig | None = None,
                head_features: int = 0) -> StepMemory:
    """`estimate_step_memory` of a `kind` training job with `cfg`: sequences of up to
    `data.max_prompt_len + data.max_new_tokens` tokens, `plan.micro_batch` per forward,
    `training.logits_chunk_rows` logits per chunk; `trainable` / `total` parameters as built; a
    head's shape from `head` (default `cfg.peftbd_head`) reading `head_features` verifier layers."""
    d, head = cfg.peftbd, head or cfg.peftbd_head
    return estimate_step_memory(
        kind, ModelShape.of(model_config), trainable=trainable, total=total, dtype=dtype,
        micro_batch=plan.micro_batch,
        sequence_tokens=cfg.data.max_prompt_len + cfg.data.max_new_tokens,
        continuation_tokens=cfg.data.max_new_tokens, chunk_rows=cfg.training.logits_chunk_rows,
        world_size=plan.world_size, zero_stage=cfg.training.zero_stage,
        block_size=head.block_size if kind == "head" else d.block_size,
        draft_layers=d.draft_layers, lora_r=d.lora_r if kind == "adapter" else 0,
        mtp_steps=cfg.fastmtp.num_steps, head_layers=head.layers,
        head_anchors=head.anchors if kind == "head" else 0,
        head_features=head_features,
    )


def log_step_memory(estimate: StepMemory, device: torch.device) -> None:
    """Log `estimate`; warn when it is above 90% of the memory of `device` (a GPU)."""
    log.info("estimated peak per training step on each worker: %.0f MiB (%s)",
             estimate.total_mib, estimate)
    if device.type == "cuda":
        card_mib = torch.cuda.get_device_properties(device).total_memory / MIB
        if estimate.total_mib > 0.9 * card_mib:
            log.warning("the estimated step peak (%.0f MiB) is above 90%% of this GPU's %.0f MiB: "
                        "lower training.micro_batch_size or training.logits_chunk_rows",
                        estimate.total_mib, card_mib)


def peaks_over_ranks(peaks: WorkerPeaks, device: torch.device) -> WorkerPeaks:
    """The largest of every rank's `peaks` (an all-reduce; this rank's alone without a process
    group), counting the ranks."""
    if not (dist.is_available() and dist.is_initialized()):
        return peaks
    values = torch.tensor([peaks.peak_rss_mib or -1.0, -1.0 if peaks.peak_gpu_mib is None
                           else peaks.peak_gpu_mib], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)  # NCCL reduces device tensors only
    rss, gpu = values.tolist()
    return WorkerPeaks(dist.get_world_size(), rss if rss >= 0 else None,
                       gpu if gpu >= 0 else None, peaks.dtype)
