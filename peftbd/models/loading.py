"""Load the verifier and its tokenizer by hub id, local directory, the embedded tiny world, or
random weights at an architecture (`random:<architecture>`)."""

from __future__ import annotations

import dataclasses
from typing import get_args

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from peftbd.config import RANDOM_WEIGHTS, Config
from peftbd.config_sections import Dtype
from peftbd.data.chat import QWEN3_CHAT_TEMPLATE
from peftbd.models.architecture import architecture_named, build_model
from peftbd.models.sources import ModelUnavailableError, unavailable_error, model_dirs
from peftbd.tiny_world.tokenizer import MASK

__all__ = ["ModelUnavailableError", "eos_token_ids", "load_tokenizer", "load_verifier",
           "model_dirs", "resolve_device", "resolve_dtype"]

DTYPES = {name: getattr(torch, name) for name in get_args(Dtype)}


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda if available else cpu; otherwise the named device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    """The configured dtype, on every device: bf16 runs on CPU when asked (slower there than
    fp32, but what the config says; the manifests and the report record the dtype that ran)."""
    if name not in DTYPES:
        raise ValueError(f"model.dtype={name!r} is not one of {sorted(DTYPES)}")
    return DTYPES[name]


def load_tokenizer(cfg: Config) -> PreTrainedTokenizerBase:
    """The verifier's tokenizer with a mask token for the drafter and the Qwen3 chat template."""
    source, _ = model_dirs(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise unavailable_error(cfg.model.name_or_path, cfg.preset, "tokenizer", exc) from exc
    if tokenizer.mask_token is None:
        tokenizer.add_special_tokens({"mask_token": MASK})
    if not tokenizer.chat_template:
        tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_verifier(cfg: Config, device: torch.device | None = None,
                  dtype: torch.dtype | None = None) -> PreTrainedModel:
    """The frozen verifier in eval mode on `device` (default: `cfg.model.device`) in `dtype`
    (default: `cfg.model.dtype`; training passes its `training.precision`)."""
    _, source = model_dirs(cfg)
    device = device or resolve_device(cfg.model.device)
    if source.startswith(RANDOM_WEIGHTS):
        arch = architecture_named(source.removeprefix(RANDOM_WEIGHTS), cfg, "model.name_or_path")
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.training.seed)  # the same weights in every process
            model = build_model(dataclasses.replace(arch, weights_dir=None),
                                dtype or resolve_dtype(cfg.model.dtype), torch.device("cpu"),
                                cfg.model.attn_implementation)
        return model.to(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=dtype or resolve_dtype(cfg.model.dtype),
            attn_implementation=cfg.model.attn_implementation,
        )
    except (OSError, ValueError) as exc:
        raise unavailable_error(cfg.model.name_or_path, cfg.preset, "model", exc) from exc
    return model.to(device).eval().requires_grad_(False)


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every id that ends a generation: the generation config's EOS ids plus `<|im_end|>`."""
    return stop_ids(model.generation_config, tokenizer)


def stop_ids(generation_config: GenerationConfig, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """`eos_token_ids` from a checkpoint's generation config (no model loaded)."""
    ids = generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    for tok in ("<|im_end|>", tokenizer.eos_token):
        tid = tokenizer.convert_tokens_to_ids(tok) if tok else None
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(tid)
    return ids
