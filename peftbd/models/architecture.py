"""The model a cost profile times: an architecture by name, with its weights where they are local
and random ones where not (a forward's cost does not depend on the weights' values). No network.

`architecture` is a local directory with a `config.json` (its weights are used when it holds
any), a hub id found in the local Hugging Face cache, `Qwen/Qwen3-0.6B` even where it is not
cached (its configuration is embedded here), or `model`: the run's own verifier
(`model.name_or_path`, the embedded tiny world included).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel, Qwen3Config

from peftbd.config import EMBEDDED_TINY, RANDOM_WEIGHTS, Config
from peftbd.models.sources import ModelUnavailableError, model_dirs

QWEN3_0_6B = "Qwen/Qwen3-0.6B"
QWEN3_0_6B_CONFIG = dict(  # Qwen/Qwen3-0.6B's config.json (architecture fields)
    vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, hidden_act="silu",
    max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
    tie_word_embeddings=True, attention_bias=False, bos_token_id=151643, eos_token_id=151645,
)
QWEN3_8B_CONFIG = dict(  # Qwen/Qwen3-8B's config.json (architecture fields): the simulator's roofline
    vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
    num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
    max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
    tie_word_embeddings=False, attention_bias=False, bos_token_id=151643, eos_token_id=151645,
)
THE_VERIFIER = "model"
_WEIGHT_FILES = ("*.safetensors", "*.bin")


@dataclass(frozen=True)
class Architecture:
    """A resolved architecture: its config, where it came from, and its weights' dir (None:
    random weights)."""

    name: str
    config: PretrainedConfig
    origin: str
    weights_dir: str | None

    @property
    def weights(self) -> str:
        return f"loaded from {self.weights_dir}" if self.weights_dir else "random (none local)"


def _has_weights(path: Path) -> bool:
    return any(next(path.glob(pattern), None) for pattern in _WEIGHT_FILES)


def resolve_architecture(cfg: Config) -> Architecture:
    """`cfg.cost_profile.architecture` as a config plus weights, without touching the network."""
    return architecture_named(cfg.cost_profile.architecture, cfg, "cost_profile.architecture")


def architecture_named(name: str, cfg: Config, key: str) -> Architecture:
    """Architecture `name` (as the module doc says; `key`: the config key that named it, for
    errors) as a config plus weights, without touching the network."""
    if name == THE_VERIFIER:
        name = cfg.model.name_or_path
        if name == EMBEDDED_TINY:
            name = model_dirs(cfg)[1]
        name = name.removeprefix(RANDOM_WEIGHTS)  # a random verifier: its architecture
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelUnavailableError(
                f"{key}={name!r} is a directory without config.json; pass a "
                f"model directory (config.json, optionally weights), a cached hub id or {QWEN3_0_6B}")
        return Architecture(name, AutoConfig.from_pretrained(path), f"local directory {path}",
                            str(path) if _has_weights(path) else None)
    try:
        config = AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as exc:
        if name != QWEN3_0_6B:
            raise ModelUnavailableError(
                f"{key}={name!r} is neither a local directory nor in the local "
                f"Hugging Face cache ({type(exc).__name__}); copy its config.json into a directory "
                f"and pass that, or use {QWEN3_0_6B} (embedded)") from exc
        return Architecture(name, Qwen3Config(**QWEN3_0_6B_CONFIG), "embedded config", None)
    from huggingface_hub import snapshot_download

    cached = Path(snapshot_download(name, local_files_only=True))
    return Architecture(name, config, "local Hugging Face cache",
                        str(cached) if _has_weights(cached) else None)


def build_model(arch: Architecture, dtype: torch.dtype, device: torch.device,
                attn_implementation: str = "sdpa") -> PreTrainedModel:
    """The architecture in eval mode on `device`: its weights when local, else random ones."""
    if arch.weights_dir:
        model = AutoModelForCausalLM.from_pretrained(arch.weights_dir, dtype=dtype,
                                                     attn_implementation=attn_implementation)
    else:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(arch.config, dtype=dtype,
                                                     attn_implementation=attn_implementation)
    return model.to(device).eval().requires_grad_(False)
