"""Load the verifier and its tokenizer by hub id, local directory or the embedded tiny world."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from peftbd.config import EMBEDDED_TINY, Config
from peftbd.config_sections import Dtype
from peftbd.data.chat import QWEN3_CHAT_TEMPLATE
from peftbd.errors import UserError
from peftbd.tiny_world.tokenizer import MASK
from peftbd.tiny_world.build import ensure_tiny_world

DTYPES = {name: getattr(torch, name) for name in get_args(Dtype)}


class ModelUnavailableError(UserError, RuntimeError):
    """The configured model or tokenizer cannot be loaded; the message says how to fix it."""


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


def model_dirs(cfg: Config) -> tuple[str, str]:
    """(tokenizer source, model source): hub ids or local paths; builds the tiny world if needed."""
    if cfg.model.name_or_path == EMBEDDED_TINY:
        world = ensure_tiny_world(cfg.tiny_world, cfg.paths.cache_dir)
        return str(world.tokenizer_dir), str(world.verifier_dir)
    return cfg.model.name_or_path, cfg.model.name_or_path


def _unavailable(name: str, preset: str, what: str, exc: Exception) -> ModelUnavailableError:
    looks_local = name.startswith((".", "/", "~")) or Path(name).expanduser().exists()
    where = (
        f"the local directory {name!r} does not hold a loadable {what}"
        if looks_local
        else f"{name!r} is not in the local Hugging Face cache and the hub is unreachable"
    )
    return ModelUnavailableError(
        f"cannot load the {what} for preset {preset!r}: {where} ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else ''}). Download it on a machine with "
        f"network access (e.g. `hf download {name} --local-dir /models/{name.split('/')[-1]}`), "
        f"copy it here and run with --set model.name_or_path=/models/{name.split('/')[-1]}; "
        f"or use --preset tiny, which needs no network."
    )


def load_tokenizer(cfg: Config) -> PreTrainedTokenizerBase:
    """The verifier's tokenizer with a mask token for the drafter and the Qwen3 chat template."""
    source, _ = model_dirs(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise _unavailable(cfg.model.name_or_path, cfg.preset, "tokenizer", exc) from exc
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
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source,
            dtype=dtype or resolve_dtype(cfg.model.dtype),
            attn_implementation=cfg.model.attn_implementation,
        )
    except (OSError, ValueError) as exc:
        raise _unavailable(cfg.model.name_or_path, cfg.preset, "model", exc) from exc
    return model.to(device).eval().requires_grad_(False)


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Every id that ends a generation: the generation config's EOS ids plus `<|im_end|>`."""
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    for tok in ("<|im_end|>", tokenizer.eos_token):
        tid = tokenizer.convert_tokens_to_ids(tok) if tok else None
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid not in ids:
            ids.append(tid)
    return ids
