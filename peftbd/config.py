"""One tree of frozen dataclasses for every stage, named presets, YAML files and `--set` overrides.

A config is built in three layers: a named preset (`tiny`, `qwen3-0.6b`: the YAML files in
`peftbd/configs/`), then an optional YAML file (a nested mapping with the same keys), then
`--set a.b=value` overrides. Every layer is type-checked against the dataclass fields (`Literal`
fields accept only their listed values); the finished config is checked against `_RANGES`,
`_ITEM_RANGES`, `_PATTERNS`, `_ORDERED` and `_LENGTHS`, and settings that would publish an
untrained drafter are refused unless `training.allow_untrained` (`peftbd.untrained`). An unknown
key or a bad value raises `ConfigError` naming the key, the value and the allowed form.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from peftbd.config_merge import ConfigError, merge
from peftbd.presets import EMBEDDED_TINY, PRESETS  # noqa: F401  (EMBEDDED_TINY re-exported)
from peftbd.untrained import check_config as _check_untrained


# The allowed values of the enum-like fields; consumers derive theirs with `typing.get_args`.
Dtype = Literal["float32", "bfloat16", "float16"]
AttnImplementation = Literal["sdpa", "eager"]
Scheduler = Literal["cosine", "constant"]
Precision = Literal["fp32", "bf16"]  # peftbd.training.deepspeed_config: bf16 or fp32, no fp16
ZeroStage = Literal[0, 1, 2, 3]
BlockOffsets = Literal["random", "aligned"]  # peftbd.training.block_diffusion.block_starts
Method = Literal["ar", "peft-bd", "fastmtp", "peft-bd-head"]  # peftbd.serving.schemas.METHODS
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
    round_retries: int = 2  # a round whose replica died is retried this often elsewhere
    recovery_timeout_s: float = 120.0  # how long a retried round waits for a live replica
    replica_num_cpus: float = 1.0
    drafter_replicas: int = 1
    verifier_replicas: int = 1
    drafter_num_gpus: float = 0.0
    verifier_num_gpus: float = 0.0  # also the colocated engine's
    placements: tuple[Placement, ...] = ("colocated", "split")  # run by jobs/placement.py
    client_concurrency: tuple[int, ...] = (1, 4, 16)  # jobs/placement.py: requests in flight


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


@dataclass(frozen=True)
class PathsConfig:
    """Where the embedded world is cached and where jobs write artifacts."""

    cache_dir: str = "~/.cache/peftbd"
    out_dir: str = "outputs"


def cache_root(cache_dir: str) -> Path:
    """The cache directory: env `PEFTBD_CACHE` when set, else `cache_dir` (`paths.cache_dir`)."""
    return Path(os.environ.get("PEFTBD_CACHE", cache_dir)).expanduser()


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


# Checks of the finished config, per section type (so `OptimConfig`'s apply to drafter.optim and
# mtp.optim): inclusive (low, high) bounds, None = unbounded; strings' forms as (regex, words);
# field pairs whose values must satisfy first <= second; lists whose length a count field fixes.
_Bounds = tuple[float | None, float | None]
_POSITIVE: _Bounds = (1, None)
_NON_NEGATIVE: _Bounds = (0, None)
_FRACTION: _Bounds = (0, 1)

_RANGES: dict[type, dict[str, _Bounds]] = {
    TinyWorldConfig: {"phrasings": (1, 7)},
    DataConfig: {"max_prompt_len": _POSITIVE, "max_new_tokens": _POSITIVE,
                 "train_size": _NON_NEGATIVE, "val_size": _NON_NEGATIVE,
                 "test_size": _NON_NEGATIVE},
    GenerateConfig: {"num_actors": _POSITIVE, "batch_size": _POSITIVE,
                     "num_cpus_per_actor": _NON_NEGATIVE, "num_gpus_per_actor": _NON_NEGATIVE},
    OptimConfig: {"lr": _NON_NEGATIVE, "warmup_ratio": _FRACTION, "weight_decay": _NON_NEGATIVE,
                  "global_batch_size": _POSITIVE,
                  "max_steps": _NON_NEGATIVE,  # 0 only with training.allow_untrained
                  "eval_every": _POSITIVE, "checkpoint_every": _POSITIVE,
                  "eval_batches": _POSITIVE},
    DrafterConfig: {"block_size": _POSITIVE, "denoise_steps": _POSITIVE,
                    "draft_layers": _NON_NEGATIVE, "early_exit_layers": _NON_NEGATIVE,
                    "lora_r": _POSITIVE, "lora_alpha": _POSITIVE, "lora_dropout": _FRACTION,
                    "mask_ratio_min": _FRACTION, "mask_ratio_max": _FRACTION,
                    "prefix_gamma": _FRACTION},
    MTPConfig: {"num_steps": _POSITIVE},
    HeadConfig: {"layers": _POSITIVE, "intermediate_size": _NON_NEGATIVE,
                 "draft_vocab": _NON_NEGATIVE, "prefix_gamma": _FRACTION, "block_stride": _POSITIVE},
    TrainingConfig: {"num_workers": _POSITIVE, "cpus_per_worker": _NON_NEGATIVE,
                     "max_failures": (-1, None),  # Ray Train's FailureConfig: -1 = retry forever
                     "micro_batch_size": _NON_NEGATIVE, "logits_chunk_rows": _NON_NEGATIVE},
    DecodingConfig: {"max_new_tokens": _POSITIVE, "num_prompts": _POSITIVE,
                     "repeats": _POSITIVE, "workers": _POSITIVE,
                     "worker_num_cpus": _NON_NEGATIVE, "worker_num_gpus": _NON_NEGATIVE,
                     "torch_threads": _NON_NEGATIVE, "sweep_repeats": _POSITIVE},
    ServingConfig: {"max_prompt_tokens": _POSITIVE, "max_tokens_cap": _POSITIVE,
                    "max_body_bytes": _POSITIVE, "max_sessions": _POSITIVE,
                    "max_batch": _POSITIVE, "batch_wait_ms": _NON_NEGATIVE,
                    "round_retries": _NON_NEGATIVE, "recovery_timeout_s": _NON_NEGATIVE,
                    "replica_num_cpus": _NON_NEGATIVE, "drafter_replicas": _POSITIVE,
                    "verifier_replicas": _POSITIVE, "drafter_num_gpus": _NON_NEGATIVE,
                    "verifier_num_gpus": _NON_NEGATIVE},
    CostProfileConfig: {"kv_len": _POSITIVE, "repeats": _POSITIVE, "threads": _NON_NEGATIVE,
                        "num_gpus": _NON_NEGATIVE, "early_exit_layers": _NON_NEGATIVE,
                        "lora_r": _POSITIVE, "lora_alpha": _POSITIVE,
                        "draft_vocab": _NON_NEGATIVE},
}
_DEVICE = (r"auto|cpu|cuda(:\d+)?", "auto, cpu, cuda or cuda:N")
_PATTERNS: dict[type, dict[str, tuple[str, str]]] = {
    ModelConfig: {"device": _DEVICE},
    CostProfileConfig: {"device": _DEVICE},
}
_ORDERED: dict[type, tuple[tuple[str, str], ...]] = {
    DrafterConfig: (("mask_ratio_min", "mask_ratio_max"), ("denoise_steps", "block_size")),
}
# list fields whose every item must lie within bounds.
_ITEM_RANGES: dict[type, dict[str, _Bounds]] = {
    MTPConfig: {"loss_weights": _NON_NEGATIVE},  # a negative weight would train away from a step
    DecodingConfig: {"batch_sizes": _POSITIVE},
    ServingConfig: {"client_concurrency": _POSITIVE},
}
# list fields that must hold at least one item, none twice.
_DISTINCT: dict[type, tuple[str, ...]] = {
    DecodingConfig: ("batch_sizes",),  # one concurrency row per (arm, batch size)
    ServingConfig: ("client_concurrency",),  # one placement row per concurrency
}
# (list field, count field): the list must hold exactly count items.
_LENGTHS: dict[type, tuple[tuple[str, str], ...]] = {
    MTPConfig: (("loss_weights", "num_steps"),),  # one loss weight per recursive step
}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def preset_names() -> list[str]:
    """Names accepted by `--preset`."""
    return sorted(PRESETS)


def load_config(
    preset: str = "tiny",
    config_file: str | Path | None = None,
    overrides: typing.Sequence[str] = (),
) -> Config:
    """Build a config from a preset, then a YAML file, then `a.b=value` overrides."""
    if preset not in PRESETS:
        raise ConfigError(
            f"unknown preset {preset!r}; choose one of: {', '.join(preset_names())}"
        )
    cfg = merge(Config(), PRESETS[preset], prefix="")
    if config_file is not None:
        cfg = merge(cfg, _read_yaml(Path(config_file)), prefix="")
    for item in overrides:
        cfg = apply_override(cfg, item)
    _check_values(cfg)
    _check_untrained(cfg)  # max_steps=0-like settings: refused unless training.allow_untrained
    return cpu_only(cfg)


def cpu_only(cfg: Config) -> Config:
    """`model.device=cpu` implies that nothing asks for a GPU: generate's actors
    (`generate.num_gpus_per_actor`), Ray Train (`training.use_gpu`), the benchmark's workers
    (`decoding.worker_num_gpus`), the serving replicas (`serving.*_num_gpus`) and the cost
    profile's task (`cost_profile.num_gpus`) all get 0, so a
    GPU preset runs on a CPU machine with that one flag (instead of waiting for GPUs that never
    come). Any other device leaves the config as it is."""
    if cfg.model.device != "cpu":
        return cfg
    r = dataclasses.replace
    return r(
        cfg,
        generate=r(cfg.generate, num_gpus_per_actor=0.0),
        training=r(cfg.training, use_gpu=False),
        decoding=r(cfg.decoding, worker_num_gpus=0.0),
        serving=r(cfg.serving, drafter_num_gpus=0.0, verifier_num_gpus=0.0),
        cost_profile=r(cfg.cost_profile, num_gpus=0.0),
    )


def apply_override(cfg: Config, item: str) -> Config:
    """Apply one `a.b=value` override; the value is parsed as YAML (`1e-3`, `true`, `[1, 2]`)."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {item!r} is not of the form a.b=value (e.g. data.seed=3)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    nested: dict[str, Any] = {}
    node = nested
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return merge(cfg, nested, prefix="")


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the config as YAML that `load_config(config_file=...)` reads back."""
    Path(path).write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections")
    return data


def _check_values(obj: Any, prefix: str = "") -> None:
    """Check a finished config (section) against `_RANGES`, `_ITEM_RANGES`, `_DISTINCT`,
    `_PATTERNS`, `_ORDERED`, `_LENGTHS`."""
    bounds, patterns = _RANGES.get(type(obj), {}), _PATTERNS.get(type(obj), {})
    for name, (low, high) in _ITEM_RANGES.get(type(obj), {}).items():
        bad = [v for v in getattr(obj, name) if (low is not None and v < low) or (high is not None and v > high)]
        if bad:
            allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise ConfigError(f"config key '{prefix}{name}': value {list(getattr(obj, name))!r} holds "
                              f"{bad[0]!r}; expected every entry {allowed}")
    for name in _DISTINCT.get(type(obj), ()):
        value = list(getattr(obj, name))
        if not value or len(set(value)) != len(value):
            raise ConfigError(f"config key '{prefix}{name}': value {value!r} must hold at least one "
                              "entry and none twice, e.g. [1, 4, 16]")
    for f in dataclasses.fields(obj):
        key, value = f"{prefix}{f.name}", getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _check_values(value, f"{key}.")
        elif f.name in bounds:
            low, high = bounds[f.name]
            if (low is not None and value < low) or (high is not None and value > high):
                allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
                raise ConfigError(
                    f"config key {key!r}: value {value!r} is out of range; expected {allowed}"
                )
        elif f.name in patterns:
            pattern, form = patterns[f.name]
            if not re.fullmatch(pattern, value):
                raise ConfigError(
                    f"config key {key!r}: value {value!r} is not valid; expected {form}"
                )
    for first, second in _ORDERED.get(type(obj), ()):
        low, high = getattr(obj, first), getattr(obj, second)
        if low > high:
            raise ConfigError(
                f"config key '{prefix}{first}': value {low!r} exceeds '{prefix}{second}' "
                f"({high!r}); expected {first} <= {second}"
            )
    for items, count in _LENGTHS.get(type(obj), ()):
        value, want = getattr(obj, items), getattr(obj, count)
        if len(value) != want:
            raise ConfigError(
                f"config key '{prefix}{items}': value {list(value)!r} has {len(value)} entries; "
                f"expected one per '{prefix}{count}' ({want})"
            )
