"""The config tree: `Config`, its sections (one frozen dataclass per stage) and the allowed values
of their enum-like fields; `peftbd.config` re-exports them beside the loading and the checks. The
presets (`peftbd/configs/*.yaml`) set every field; the defaults here are the fallbacks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from peftbd.presets import EMBEDDED_TINY


# The allowed values of the enum-like fields; consumers derive theirs with `typing.get_args`.
Dtype = Literal["float32", "bfloat16", "float16"]
AttnImplementation = Literal["sdpa", "eager"]
Scheduler = Literal["cosine", "constant"]
Precision = Literal["fp32", "bf16"]  # peftbd.training.deepspeed_config: bf16 or fp32, no fp16
ZeroStage = Literal[0, 1, 2, 3]
BlockOffsets = Literal["random", "aligned"]  # peftbd.training.block_diffusion.block_starts
Method = Literal["ar", "peft-bd", "fastmtp", "peft-bd-head"]  # peftbd.serving.schemas.METHODS
DrafterSync = Literal["ship", "forward"]  # peftbd.serving.models.SHIPPED
Placement = Literal[  # jobs.placement.placement_options
    "colocated", "split", "split-cross-node", "split-same-node", "split-fractional-gpu",
]


@dataclass(frozen=True)
class ModelConfig:
    """The verifier: hub id, local directory, or `embedded:tiny`."""

    name_or_path: str = EMBEDDED_TINY
    dtype: Dtype = "float32"  # what every stage that loads the verifier runs, CPU included
    attn_implementation: AttnImplementation = "sdpa"
    device: str = "auto"  # auto | cpu | cuda | cuda:N; cpu: no GPU request anywhere (`cpu_only`)


@dataclass(frozen=True)
class TinyWorldConfig:
    """How the embedded tiny world (corpus, tokenizer, verifier) is built; deterministic from `seed`."""

    seed: int = 0
    corpus_rows: int = 448  # documents, one corpus row each
    vocab_size: int = 2048
    hidden_size: int = 192
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 48
    intermediate_size: int = 768
    max_position_embeddings: int = 2048
    phrasings: int = 4  # each document is taught under this many phrasings (< 8)
    train_steps: int = 1200
    train_batch_size: int = 8
    train_seq_len: int = 512
    lr: float = 3e-3
    # use the world shipped with the package (`peftbd.tiny_world.shipped`) when it was built from
    # exactly these settings and this code; false: build it from the recipe (~4 min on 2 cores)
    shipped: bool = True


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from and the artifact's length limits and split sizes."""

    source: str = EMBEDDED_TINY  # embedded:tiny | hub id | *.parquet | *.jsonl | spec-bench:PATH
    hub_split: str = "train"
    max_prompt_len: int = 512
    max_new_tokens: int = 256
    train_size: int = 50_000
    val_size: int = 1_000
    test_size: int = 1_000
    seed: int = 0


@dataclass(frozen=True)
class GenerateConfig:
    """Ray Data generation: verifier actors and their batch size and resources."""

    num_actors: int = 2
    batch_size: int = 16
    num_cpus_per_actor: float = 1.0
    num_gpus_per_actor: float = 0.0


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and schedule of one training job."""

    lr: float = 2e-4
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    scheduler: Scheduler = "cosine"
    global_batch_size: int = 64
    max_steps: int = 10_000
    eval_every: int = 500
    checkpoint_every: int = 500
    eval_batches: int = 16


@dataclass(frozen=True)
class DrafterConfig:
    """The PEFT-BD drafter: LoRA adapter, block size, denoising and its training objective."""

    block_size: int = 16
    denoise_steps: int = 1
    anchored: bool = False
    draft_layers: int = 0  # 0: the whole backbone drafts (the paper); k: only layers 0..k-1 do
    early_exit_layers: int = 0  # the main job's early-exit arm: its adapter's draft_layers (0: none)
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: tuple[str, ...] = (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )
    mask_ratio_min: float = 0.3
    mask_ratio_max: float = 1.0
    prefix_gamma: float = 0.9
    # where training cuts blocks: random = at a random offset per (row, epoch), as the engine
    # drafts from wherever a round ended; aligned = at the reply start (BD3LM, the ablation)
    block_offsets: BlockOffsets = "random"
    offsets_ablation: bool = True  # the main job also trains + benchmarks the other block_offsets
    optim: OptimConfig = field(default_factory=OptimConfig)


@dataclass(frozen=True)
class MTPConfig:
    """The FastMTP head: recursive steps and per-step loss weights."""

    num_steps: int = 3
    loss_weights: tuple[float, ...] = (0.51, 0.31, 0.18)
    optim: OptimConfig = field(
        default_factory=lambda: OptimConfig(lr=5e-5, warmup_ratio=0.05, weight_decay=0.1)
    )


@dataclass(frozen=True)
class HeadConfig:
    """The block-diffusion head (DFlash-style, `peftbd.models.bd_head`): its own decoder layers
    draft a `drafter.block_size` block in one forward from the verifier's hidden states."""

    layers: int = 1  # the head's own Qwen3 decoder layers
    intermediate_size: int = 0  # their MLP width; 0 = the verifier's
    feature_layers: tuple[int, ...] = ()  # verifier hidden states (0 = embeddings, L = final); () = 3 spread
    draft_vocab: int = 0  # > 0: a second arm drafts over the artifact's N most frequent tokens
    prefix_gamma: float = 0.9  # the linear-prefix loss's discount per block position
    block_stride: int = 4  # training cuts a (whole, overlapping) block every this many positions
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3))


@dataclass(frozen=True)
class TrainingConfig:
    """Ray Train + DeepSpeed settings shared by both training jobs."""

    num_workers: int = 2
    use_gpu: bool = False
    cpus_per_worker: float = 1.0
    zero_stage: ZeroStage = 0
    precision: Precision = "fp32"  # the dtype training runs in (verifier included), CPU too
    seed: int = 0
    max_failures: int = 2
    micro_batch_size: int = 0  # sequences per worker per forward; 0 = global batch / workers
    # positions whose logits one LM-head call computes in the loss (peftbd.training.chunked_loss);
    # a step never holds more than one chunk of vocabulary-wide logits. 0 = all at once
    logits_chunk_rows: int = 512
    storage_path: str = ""  # Ray Train checkpoints; "" = a ray_train/ dir beside --out
    # publish a drafter that settings leave untrained (*.optim.max_steps=0, *.optim.lr=0,
    # mtp.loss_weights all 0, no train rows): refused unless true; its manifest says untrained
    allow_untrained: bool = False


@dataclass(frozen=True)
class DecodingConfig:
    """Benchmark decoding: how many prompts, how many tokens, how many repeats."""

    max_new_tokens: int = 256
    num_prompts: int = 1_000
    repeats: int = 3
    # Benchmark timing actors: the prompts are split between `workers` actors and each times its
    # own prompts one after another (batch 1). One actor per GPU on a cluster; on a CPU box at most
    # one single-threaded actor per core (they still share the memory system: jobs.benchmark).
    workers: int = 1
    worker_num_cpus: float = 1.0
    worker_num_gpus: float = 0.0
    # Intra-op threads per timing actor (0 = torch's default). 1 on CPU: on the 2-core box with
    # other work running, tiny-model AR at 2 threads measured 5-8x slower than at 1.
    torch_threads: int = 1
    # Concurrency sweep: every arm also decodes the same prompts with continuous batching at each
    # of these batch sizes (at most B requests at once); results.json `concurrency`.
    batch_sizes: tuple[int, ...] = (1, 4, 16)
    # The sweep's batched passes (B > 1) run in the first `sweep_repeats` repeats (at most
    # `repeats`; batch 1 is every repeat's batch-1 pass); tok/s is the median over them.
    sweep_repeats: int = 3
    # Verify (the AR step and the verify over k + 1) through one torch.compile'd graph over static
    # KV (peftbd.decoding.fast_path); tokens as eager's. Off: on the 2-core box each graph (batch
    # 1 / B, width 1 / k + 1) compiles in 10-60 s, more than a tiny benchmark arm decodes in.
    fast_path: bool = False
    # Controlled ("synthetic") acceptance (peftbd.decoding.controlled): each "arm=tokens" entry
    # adds arm "<arm>_synthetic", the arm's real drafts forced to `tokens` accepted tokens per
    # round on average (bonus included; geometric over its draft positions), verification real,
    # so its output is AR's. The cost profile decodes the same arms at the paper's architecture.
    synthetic: tuple[str, ...] = ()
    synthetic_seed: int = 0  # the draws' seed (a request's draws depend on it and its prompt only)
    # Acceptance under sampling (peftbd.benchmarking.sampled; results.json `sampling`): at each
    # temperature > 0 every arm but the synthetic ones decodes the first `sampling_prompts`
    # prompts (0: all) once more at batch 1, each request seeded by `sampling_seed` and its
    # prompt's id; 0 is the greedy batch-1 pass itself (not decoded again).
    temperatures: tuple[float, ...] = (0.0, 1.0)
    sampling_prompts: int = 0
    sampling_seed: int = 0


@dataclass(frozen=True)
class ServingConfig:
    """Ray Serve: the served model name, request limits, per-request state and placement."""

    model_name: str = "peftbd"  # GET /v1/models lists it and "<model_name>:<method>"
    default_method: Method = "peft-bd"  # when the request names none
    max_prompt_tokens: int = 512
    max_tokens_cap: int = 256  # also the default max_tokens
    max_body_bytes: int = 1_000_000
    max_sessions: int = 64  # per-request KV states a replica keeps (least recently used go)
    max_batch: int = 16  # requests one replica steps together per method (one batched call)
    batch_wait_ms: float = 2.0  # how long a batch that is not full waits for more requests
    # split: requests are dealt into this many groups, each moving in lockstep; with 2+ the
    # Drafter drafts one group while the Verifier verifies another (1: all in lockstep)
    split_groups: int = 2
    # split: how a Drafter catches a request up with what the Verifier committed. ship: the
    # Verifier sends the state the drafter reads (PEFT-BD: the KV of the positions it cached;
    # FastMTP: their final hidden states); forward: the Drafter runs its own verifier forward
    # over them. The block-diffusion head always takes the Verifier's features.
    drafter_sync: DrafterSync = "ship"
    round_retries: int = 2  # a round whose replica died is retried this often elsewhere
    recovery_timeout_s: float = 120.0  # how long a retried round waits for a live replica
    replica_num_cpus: float = 1.0
    drafter_replicas: int = 1
    verifier_replicas: int = 1
    drafter_num_gpus: float = 0.0
    verifier_num_gpus: float = 0.0  # also the colocated engine's
    placements: tuple[Placement, ...] = ("colocated", "split")  # run by jobs/placement.py
    placement_methods: tuple[Method, ...] = ("ar", "peft-bd", "fastmtp", "peft-bd-head")  # ditto
    client_concurrency: tuple[int, ...] = (1, 4, 16, 32)  # jobs/placement.py: requests in flight
    # jobs/placement.py: capacity = the most clients that each still get >= this share of one
    # client's tok/s
    capacity_fraction: float = 0.5
    # Controlled ("synthetic") acceptance in both apps: each "method=tokens" entry serves that
    # method's real drafts forced to `tokens` accepted tokens per round (decoding.synthetic_seed;
    # oracle: the replica's own greedy AR output of the prompt); labelled synthetic in usage and
    # metrics. Empty: every method's own acceptance.
    synthetic: tuple[str, ...] = ()


RooflineGPU = Literal["H200", "H100"]  # peftbd.benchmarking.roofline.GPUS


@dataclass(frozen=True)
class CostProfileConfig:
    """The draft-cost profile at the paper's architecture (jobs.cost_profile): one round of every
    arm, timed with the engine's own code on a model of `architecture`'s shape."""

    architecture: str = "Qwen/Qwen3-0.6B"  # hub id (local HF cache) | local dir | "model"
    kv_len: int = 512  # committed tokens in the KV cache when a round is timed
    repeats: int = 3  # timed rounds per arm (arms interleaved); medians are reported
    dtypes: tuple[Dtype, ...] = ("float32", "bfloat16")
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 1  # torch intra-op threads on CPU (0 = torch's default)
    num_gpus: float = 0.0  # GPUs of the Ray task that runs the profile
    early_exit_layers: int = 14  # the early-exit arm's depth at this architecture (0: no arm)
    lora_r: int = 16  # the adapters' rank and alpha at this architecture (the paper's)
    lora_alpha: int = 32
    draft_vocab: int = 32768  # the head's draft-vocabulary arm at this architecture (0: no arm)
    roofline_gpu: RooflineGPU = "H200"
    # Measured decoding at this architecture (peftbd.benchmarking.shape_decode): AR and the
    # decoding.synthetic arms decode this many random prompts of kv_len tokens (0 tokens: none)
    decode_prompts: int = 2
    decode_tokens: int = 32


@dataclass(frozen=True)
class PathsConfig:
    """Where the embedded world is cached and where jobs write artifacts."""

    cache_dir: str = "~/.cache/peftbd"
    out_dir: str = "outputs"


@dataclass(frozen=True)
class Config:
    """The whole configuration tree."""

    preset: str = "tiny"
    model: ModelConfig = field(default_factory=ModelConfig)
    tiny_world: TinyWorldConfig = field(default_factory=TinyWorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    mtp: MTPConfig = field(default_factory=MTPConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    serving: ServingConfig = field(default_factory=ServingConfig)
    cost_profile: CostProfileConfig = field(default_factory=CostProfileConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists), for manifests and YAML."""
        return _plain(dataclasses.asdict(self))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
