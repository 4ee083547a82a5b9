"""The config tree: `Config`, its sections (one frozen dataclass per stage) and the allowed values
of their enum-like fields, their values' rules from `peftbd.config_rules`; `peftbd.config`
re-exports them beside the loading and the checks.

The presets (`peftbd/configs/*.yaml`) are the only source of values: no field has a default, so
`Config()` cannot be built by accident; `peftbd.config.load_config` builds a preset's complete
tree. A field's rule is in its annotation (`Annotated[int, Range(1)]`, on a list's item type for
every entry), which `peftbd.config` checks once the config is complete.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Literal

from peftbd.config_rules import (  # noqa: F401 - re-exported: the sections' rules
    DISTINCT,
    ArmTokens,
    Device,
    Form,
    Fraction,
    MethodTokens,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    Range,
)
from peftbd.config_serving import DrafterSync, Method, Placement, ServingConfig  # noqa: F401 - re-exported

# The allowed values of the enum-like fields; consumers derive theirs with `typing.get_args`.
Dtype = Literal["float32", "bfloat16", "float16"]
ProfileDtype = Literal["float32", "bfloat16", "float16", "native"]
"""A `Dtype`, or "native": bfloat16 where the device runs it natively, else float32."""
AttnImplementation = Literal["sdpa", "eager"]
Scheduler = Literal["cosine", "constant"]
ReferenceEngine = Literal["hf_generate", "vllm"]  # the audit's: peftbd.benchmarking.references
Precision = Literal["fp32", "bf16"]  # peftbd.training.deepspeed_config: bf16 or fp32, no fp16
ZeroStage = Literal[0, 1, 2, 3]
BlockOffsets = Literal["random", "aligned"]  # peftbd.training.block_diffusion.block_starts


@dataclass(frozen=True)
class ModelConfig:
    """The verifier: hub id, local directory, or `embedded:tiny`."""

    name_or_path: str
    dtype: Dtype  # what every stage that loads the verifier runs, CPU included
    attn_implementation: AttnImplementation
    device: Device  # auto | cpu | cuda | cuda:N; cpu: no GPU request anywhere (`cpu_only`)


@dataclass(frozen=True)
class TinyWorldConfig:
    """How the embedded tiny world (corpus, tokenizer, verifier) is built; deterministic from `seed`."""

    seed: int
    corpus_rows: int  # documents, one corpus row each
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    phrasings: Annotated[int, Range(1, 7)]  # each document is taught under this many phrasings (< 8)
    train_steps: int  # the most steps the verifier trains (the cosine schedule's length)
    # > 0: stop once the held-out loss (nats/token) is at most this: worlds trained to equal recall
    heldout_loss_target: Annotated[float, Range(0.0, None)]
    train_batch_size: int
    train_seq_len: int
    lr: float
    # use the world shipped with the package (`peftbd.tiny_world.shipped`) when it was built from
    # exactly these settings and this code; false: build it from the recipe (~6 min on 2 cores)
    shipped: bool


@dataclass(frozen=True)
class DataConfig:
    """Where prompts come from and the artifact's length limits and split sizes."""

    source: str  # embedded:tiny | hub id | *.parquet | *.jsonl | spec-bench:PATH
    hub_split: str
    max_prompt_len: PositiveInt
    max_new_tokens: PositiveInt
    train_size: NonNegativeInt
    val_size: NonNegativeInt
    test_size: NonNegativeInt
    seed: int


@dataclass(frozen=True)
class GenerateConfig:
    """Ray Data generation: verifier actors and their batch size and resources."""

    # engine: our engine's greedy AR in Ray Data actors; vllm: vLLM through ray.data.llm
    # (scripts/install.sh --with-vllm), one engine an actor
    backend: Literal["engine", "vllm"]
    num_actors: PositiveInt
    batch_size: PositiveInt
    num_cpus_per_actor: NonNegativeFloat
    num_gpus_per_actor: NonNegativeFloat


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and schedule of one training job."""

    lr: NonNegativeFloat
    warmup_ratio: Fraction
    weight_decay: NonNegativeFloat
    scheduler: Scheduler
    global_batch_size: PositiveInt
    max_steps: NonNegativeInt
    eval_every: PositiveInt
    checkpoint_every: PositiveInt
    eval_batches: PositiveInt


@dataclass(frozen=True)
class DrafterConfig:
    """The PEFT-BD drafter: LoRA adapter, block size, denoising and its training objective."""

    block_size: PositiveInt
    denoise_steps: PositiveInt
    anchored: bool
    draft_layers: NonNegativeInt  # 0: the whole backbone drafts (the paper); k: only layers 0..k-1 do
    early_exit_layers: NonNegativeInt  # the main job's early-exit arm: its draft_layers (0: none)
    lora_r: PositiveInt
    lora_alpha: PositiveInt
    lora_dropout: Fraction
    target_modules: tuple[str, ...]
    mask_ratio_min: Fraction
    mask_ratio_max: Fraction
    prefix_gamma: Fraction
    # where training cuts blocks: random = at a random offset per (row, epoch), as the engine
    # drafts from wherever a round ended; aligned = at the reply start (BD3LM, the ablation)
    block_offsets: BlockOffsets
    offsets_ablation: bool  # the main job also trains + benchmarks the other block_offsets
    optim: OptimConfig

    ORDERED: ClassVar[tuple[tuple[str, str], ...]] = (
        ("mask_ratio_min", "mask_ratio_max"), ("denoise_steps", "block_size"))


@dataclass(frozen=True)
class MTPConfig:
    """The FastMTP head: recursive steps and per-step loss weights."""

    num_steps: PositiveInt
    loss_weights: tuple[NonNegativeFloat, ...]
    optim: OptimConfig

    LENGTHS: ClassVar[tuple[tuple[str, str], ...]] = (("loss_weights", "num_steps"),)  # one weight a step


@dataclass(frozen=True)
class HeadConfig:
    """The block-diffusion head (DFlash-style, `peftbd.models.bd_head`): its own decoder layers
    draft a `block_size` block in one forward from the verifier's hidden states."""

    block_size: Annotated[int, Range(2)]  # D: the block's positions, its first the last committed token
    layers: PositiveInt  # the head's own Qwen3 decoder layers
    intermediate_size: NonNegativeInt  # their MLP width; 0 = the verifier's
    feature_layers: tuple[int, ...]  # verifier hidden states (0 = embeddings, L = final); () = rule's
    # feature_layers () reads: three = 3 spread over the depth; per_layer = DFlash's, one a head layer
    feature_rule: Literal["three", "per_layer"]  # peftbd.models.bd_head.feature_layers
    # the chunk: block = [b, D masks] drafts D tokens; block_minus_one = [b, D-1 masks], D-1 (DFlash)
    block_masks: Literal["block", "block_minus_one"]
    # the chunk's first token: its embedding fused with its predecessor's context (EAGLE/MTP) or,
    # false, its plain embedding (DFlash; what vLLM's dflash drafter runs)
    anchor_fusion: bool
    anchored: bool  # the block's first token sees the masks too (DFlash's non-causal block)
    draft_vocab: NonNegativeInt  # > 0: a second arm drafts over the artifact's N most frequent tokens
    prefix_gamma: Fraction  # the linear-prefix loss's discount per block position
    loss_decay: NonNegativeFloat  # 0 = prefix_gamma's loss; > 0 = DFlash's exp(-j / loss_decay)
    block_stride: PositiveInt  # anchors 0: a (whole, overlapping) block every this many positions
    anchors: NonNegativeInt  # 0 = block_stride's blocks; N > 0 = up to N random per row (DFlash)
    optim: OptimConfig


@dataclass(frozen=True)
class TrainingConfig:
    """Ray Train + DeepSpeed settings shared by both training jobs."""

    num_workers: PositiveInt
    use_gpu: bool
    cpus_per_worker: NonNegativeFloat
    zero_stage: ZeroStage
    precision: Precision  # the dtype training runs in (verifier included), CPU too
    seed: int
    max_failures: Annotated[int, Range(-1)]
    micro_batch_size: NonNegativeInt  # sequences per worker per forward; 0 = global batch / workers
    # positions whose logits one LM-head call computes in the loss (peftbd.training.chunked_loss);
    # a step never holds more than one chunk of vocabulary-wide logits. 0 = all at once
    logits_chunk_rows: NonNegativeInt
    # micro-batches per window whose rows are sorted by length before they are batched, so a
    # micro-batch pads little (peftbd.training.length_groups; transformers' group_by_length);
    # 0 = the split's own order
    length_grouping: NonNegativeInt
    storage_path: str  # Ray Train checkpoints; "" = a ray_train/ dir beside --out
    # publish a drafter that settings leave untrained (*.optim.max_steps=0, *.optim.lr=0,
    # fastmtp.loss_weights all 0, no train rows): refused unless true; its manifest says untrained
    allow_untrained: bool


@dataclass(frozen=True)
class DecodingConfig:
    """Benchmark decoding: how many prompts, how many tokens, how many repeats."""

    max_new_tokens: PositiveInt
    num_prompts: PositiveInt
    repeats: PositiveInt
    # Benchmark timing actors: the prompts are split between `workers` actors and each times its
    # own prompts one after another (batch 1). One actor per GPU on a cluster; on a CPU box at most
    # one single-threaded actor per core (they still share the memory system: jobs.benchmark).
    workers: PositiveInt
    worker_num_cpus: NonNegativeFloat
    worker_num_gpus: NonNegativeFloat
    # Intra-op threads per timing actor (0 = torch's default). 1 on CPU: on the 2-core box with
    # other work running, tiny-model AR at 2 threads measured 5-8x slower than at 1.
    torch_threads: NonNegativeInt
    # Concurrency sweep: every arm also decodes the same prompts with continuous batching at each
    # of these batch sizes (at most B requests at once); results.json `concurrency`.
    batch_sizes: Annotated[tuple[PositiveInt, ...], DISTINCT]
    # The sweep's batched passes (B > 1) run in the first `sweep_repeats` repeats (at most
    # `repeats`; batch 1 is every repeat's batch-1 pass); tok/s is the median over them.
    sweep_repeats: PositiveInt
    # Whether the batched passes also cover the variant arms (an arm whose id is not its
    # method's: PEFT-BD's 2-step and anchored decoding, the head's draft vocabulary, the
    # synthetic arms); false: AR and each method's own arm only (batch 1 covers every arm).
    sweep_variants: bool
    # Every round forward (the verify, every drafter's draft, a catch-up) as torch.compile'd
    # graphs over static KV (peftbd.decoding.fast_path; CUDA graphs on CUDA); tokens as eager's.
    # true, false, or auto: on for CUDA (what SGLang and vLLM run), off on CPU. The presets say
    # what compiling costs on the 2-core box. The benchmark refuses to time a drafter whose draft
    # would stay eager beside compiled AR (a plugin without draft_on_path).
    fast_path: bool | Literal["auto"]
    # Tokens per packed prefill forward (peftbd.decoding.packed): a step's prompts run as one
    # sequence without padding, cut into forwards of at most this many tokens (the benchmark's
    # and serving's engines). The benchmark's scheduler runs one chunk per round of the running
    # requests; serving's step loop still prefills its arrivals' chunks back to back. Outputs
    # do not depend on it.
    prefill_chunk: PositiveInt
    # Controlled ("synthetic") acceptance (peftbd.decoding.controlled): each "arm=tokens" entry
    # adds arm "<arm>_synthetic", the arm's real drafts forced to `tokens` accepted tokens per
    # round on average (bonus included; geometric over its draft positions), verification real,
    # so its output is AR's. The cost profile decodes the same arms at the paper's architecture.
    synthetic: tuple[ArmTokens, ...]
    synthetic_seed: int  # the draws' seed (a request's draws depend on it and its prompt only)
    # Acceptance under sampling (peftbd.benchmarking.sampled; results.json `sampling`): at each
    # temperature > 0 every arm but the synthetic ones decodes the first `sampling_prompts`
    # prompts (0: all) once more at batch 1, each request seeded by `sampling_seed` and its
    # prompt's id; 0 is the greedy batch-1 pass itself (not decoded again).
    temperatures: Annotated[tuple[NonNegativeFloat, ...], DISTINCT]
    sampling_prompts: NonNegativeInt
    sampling_seed: int
    reference_engines: Annotated[tuple[ReferenceEngine, ...], DISTINCT]
    reference_prompts: NonNegativeInt


RooflineGPU = Literal["H200", "H100"]  # peftbd.benchmarking.roofline.GPUS


@dataclass(frozen=True)
class CostProfileConfig:
    """The draft-cost profile at the paper's architecture (jobs.cost_profile): one round of every
    arm, timed with the engine's own code on a model of `architecture`'s shape."""

    architecture: str  # hub id (local HF cache) | local dir | "model"
    kv_len: PositiveInt  # committed tokens in the KV cache when a round is timed
    repeats: PositiveInt  # timed rounds per arm (arms interleaved); medians are reported
    # each timed in turn; "native": bfloat16 where the device runs it natively (a GPU; a CPU
    # with AVX-512 BF16 or AMX: the report's hardware line names which), else float32
    dtypes: tuple[ProfileDtype, ...]
    device: Device  # auto | cpu | cuda | cuda:N
    threads: NonNegativeInt  # torch intra-op threads on CPU (0 = torch's default)
    num_gpus: NonNegativeFloat  # GPUs of the Ray task that runs the profile
    early_exit_layers: NonNegativeInt  # the early-exit arm's depth at this architecture (0: no arm)
    lora_r: PositiveInt  # the adapters' rank and alpha at this architecture (the paper's)
    lora_alpha: PositiveInt
    draft_vocab: NonNegativeInt  # the head's draft-vocabulary arm at this architecture (0: no arm)
    dflash_layers: Annotated[tuple[PositiveInt, ...], DISTINCT]  # DFlash heads timed at these depths
    roofline_gpu: RooflineGPU
    # Measured decoding at this architecture (peftbd.benchmarking.shape_decode): AR and the
    # decoding.synthetic arms decode this many random prompts of kv_len tokens (0 tokens: none)
    decode_prompts: PositiveInt
    decode_tokens: NonNegativeInt


@dataclass(frozen=True)
class MethodsConfig:
    """The drafting methods beyond the built-in ones (`peftbd.methods`)."""

    # importable modules that each register a method (docs/adding-a-drafter.md); every process
    # that loads the config imports them: the pipeline, training workers, benchmark tasks, Serve
    plugins: tuple[str, ...]


@dataclass(frozen=True)
class PathsConfig:
    """Where the embedded world is cached and where jobs write artifacts."""

    cache_dir: str
    out_dir: str


@dataclass(frozen=True)
class Config:
    """The whole configuration tree."""

    preset: str
    model: ModelConfig
    tiny_world: TinyWorldConfig
    data: DataConfig
    generate: GenerateConfig
    methods: MethodsConfig
    training: TrainingConfig
    decoding: DecodingConfig
    serving: ServingConfig
    cost_profile: CostProfileConfig
    paths: PathsConfig
    sections: dict[str, Any] = field(default_factory=dict, hash=False)
    """Each registered drafting method's section, by method id (`peftbd.methods.Method.config`):
    read as `cfg.<id>` (e.g. `cfg.peftbd.block_size`), written at the top level of YAML."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "sections":
            raise AttributeError(name)
        try:
            return self.__dict__["sections"][name]
        except KeyError:
            raise AttributeError(f"the config has no section {name!r}; method sections: "
                                 f"{', '.join(self.__dict__.get('sections', {})) or 'none'}") from None

    def with_section(self, method_id: str, section: Any) -> Config:
        """This config with method `method_id`'s section replaced."""
        return dataclasses.replace(self, sections={**self.sections, method_id: section})

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples as lists), for manifests and YAML: the method sections at the
        top level, after `methods`."""
        core = {f.name: _plain(dataclasses.asdict(getattr(self, f.name)))
                if dataclasses.is_dataclass(getattr(self, f.name)) else getattr(self, f.name)
                for f in dataclasses.fields(self) if f.name != "sections"}
        out: dict[str, Any] = {}
        for key, value in core.items():
            out[key] = value
            if key == "methods":
                out.update({k: _plain(dataclasses.asdict(v)) for k, v in self.sections.items()})
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
