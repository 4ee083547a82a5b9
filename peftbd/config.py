"""One tree of frozen dataclasses for every stage, named presets, YAML files and `--set` overrides.

The tree is `Config`, one section per stage (`peftbd.config_sections`, re-exported here).

A config is built in three layers: a named preset (`tiny`, `qwen3-0.6b`: the YAML files in
`peftbd/configs/`), then an optional YAML file (a nested mapping with the same keys), then
`--set a.b=value` overrides. Every layer is type-checked against the dataclass fields (`Literal`
fields accept only their listed values); the finished config is checked against `_RANGES`,
`_ITEM_RANGES`, `_ITEM_PATTERNS`, `_PATTERNS`, `_ORDERED` and `_LENGTHS`, and settings that
would publish an untrained drafter are refused unless `training.allow_untrained`
(`peftbd.untrained`). An unknown key or a bad value raises `ConfigError` naming the key, the
value and the allowed form.
"""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from peftbd.config_merge import ConfigError, merge
from peftbd.config_sections import (
    Config,
    CostProfileConfig,
    DataConfig,
    DecodingConfig,
    DrafterConfig,
    GenerateConfig,
    HeadConfig,
    ModelConfig,
    MTPConfig,
    OptimConfig,
    PathsConfig,
    ServingConfig,
    TinyWorldConfig,
    TrainingConfig,
)
from peftbd.presets import EMBEDDED_TINY, PRESETS, RANDOM_WEIGHTS
from peftbd.untrained import check_config as _check_untrained

__all__ = [  # the sections and EMBEDDED_TINY are re-exported: import them from here
    "EMBEDDED_TINY", "RANDOM_WEIGHTS", "Config", "ConfigError", "CostProfileConfig", "DataConfig", "DecodingConfig",
    "DrafterConfig", "GenerateConfig", "HeadConfig", "MTPConfig", "ModelConfig", "OptimConfig",
    "PathsConfig", "ServingConfig", "TinyWorldConfig", "TrainingConfig", "apply_override",
    "cache_root", "cpu_only", "load_config", "preset_names", "save_config",
]


def cache_root(cache_dir: str) -> Path:
    """The cache directory: env `PEFTBD_CACHE` when set, else `cache_dir` (`paths.cache_dir`)."""
    return Path(os.environ.get("PEFTBD_CACHE", cache_dir)).expanduser()


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
                     "torch_threads": _NON_NEGATIVE, "sweep_repeats": _POSITIVE,
                     "sampling_prompts": _NON_NEGATIVE},
    ServingConfig: {"max_prompt_tokens": _POSITIVE, "max_tokens_cap": _POSITIVE,
                    "max_body_bytes": _POSITIVE, "max_sessions": _POSITIVE,
                    "max_batch": _POSITIVE, "split_groups": _POSITIVE,
                    "batch_wait_ms": _NON_NEGATIVE,
                    "round_retries": _NON_NEGATIVE, "recovery_timeout_s": _NON_NEGATIVE,
                    "replica_num_cpus": _NON_NEGATIVE, "drafter_replicas": _POSITIVE,
                    "verifier_replicas": _POSITIVE, "drafter_num_gpus": _NON_NEGATIVE,
                    "capacity_fraction": _FRACTION,
                    "verifier_num_gpus": _NON_NEGATIVE},
    CostProfileConfig: {"kv_len": _POSITIVE, "repeats": _POSITIVE, "threads": _NON_NEGATIVE,
                        "num_gpus": _NON_NEGATIVE, "early_exit_layers": _NON_NEGATIVE,
                        "lora_r": _POSITIVE, "lora_alpha": _POSITIVE,
                        "draft_vocab": _NON_NEGATIVE, "decode_prompts": _POSITIVE,
                        "decode_tokens": _NON_NEGATIVE},
}
_DEVICE = (r"auto|cpu|cuda(:\d+)?", "auto, cpu, cuda or cuda:N")
_PATTERNS: dict[type, dict[str, tuple[str, str]]] = {
    ModelConfig: {"device": _DEVICE},
    CostProfileConfig: {"device": _DEVICE},
}
# list fields whose every item must match a form: (regex, the form in words).
_ITEM_PATTERNS: dict[type, dict[str, tuple[str, str]]] = {
    DecodingConfig: {"synthetic": (r"[a-z][a-z0-9_]*=\d+(\.\d+)?",
                                   "arm=tokens_per_round, e.g. peftbd=2.881")},
    ServingConfig: {"synthetic": (r"[a-z][a-z0-9-]*=\d+(\.\d+)?",
                                  "method=tokens_per_round, e.g. peft-bd=2.881")},
}
_ORDERED: dict[type, tuple[tuple[str, str], ...]] = {
    DrafterConfig: (("mask_ratio_min", "mask_ratio_max"), ("denoise_steps", "block_size")),
}
# list fields whose every item must lie within bounds.
_ITEM_RANGES: dict[type, dict[str, _Bounds]] = {
    MTPConfig: {"loss_weights": _NON_NEGATIVE},  # a negative weight would train away from a step
    DecodingConfig: {"batch_sizes": _POSITIVE, "temperatures": _NON_NEGATIVE},
    ServingConfig: {"client_concurrency": _POSITIVE},
}
# list fields that must hold at least one item, none twice.
_DISTINCT: dict[type, tuple[str, ...]] = {
    DecodingConfig: ("batch_sizes", "temperatures"),  # one row per (arm, batch size / temperature)
    ServingConfig: ("client_concurrency",),  # one placement row per concurrency
}
# (list field, count field): the list must hold exactly count items.
_LENGTHS: dict[type, tuple[tuple[str, str], ...]] = {
    MTPConfig: (("loss_weights", "num_steps"),),  # one loss weight per recursive step
}


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
    """Check a finished config (section) against `_RANGES`, `_ITEM_RANGES`, `_ITEM_PATTERNS`,
    `_DISTINCT`, `_PATTERNS`, `_ORDERED`, `_LENGTHS`."""
    bounds, patterns = _RANGES.get(type(obj), {}), _PATTERNS.get(type(obj), {})
    for name, (low, high) in _ITEM_RANGES.get(type(obj), {}).items():
        bad = [v for v in getattr(obj, name) if (low is not None and v < low) or (high is not None and v > high)]
        if bad:
            allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise ConfigError(f"config key '{prefix}{name}': value {list(getattr(obj, name))!r} holds "
                              f"{bad[0]!r}; expected every entry {allowed}")
    for name, (pattern, form) in _ITEM_PATTERNS.get(type(obj), {}).items():
        bad = [v for v in getattr(obj, name) if not re.fullmatch(pattern, v)]
        if bad:
            raise ConfigError(f"config key '{prefix}{name}': entry {bad[0]!r} is not valid; "
                              f"expected {form}")
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
