"""The named presets: plain nested mappings with the config tree's keys (`peftbd.config`
type-checks them like any YAML file). `tiny` is the embedded world on CPU; `qwen3-0.6b` is the
paper's setting."""

from __future__ import annotations

from typing import Any

EMBEDDED_TINY = "embedded:tiny"
"""`model.name_or_path` / `data.source` value that selects the embedded tiny world."""


def _tiny_optim(lr: float, max_steps: int, **kw: Any) -> dict[str, Any]:
    """Tiny training budget: ~1-2 min per job on 2 CPU workers (Ray + DeepSpeed start-up included)
    that still clearly beats an untrained drafter (numbers in docs/architecture.md, Training)."""
    return {"lr": lr, "global_batch_size": 16, "max_steps": max_steps, "eval_every": 50,
            "checkpoint_every": 50, "eval_batches": 3, **kw}


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "preset": "tiny",
        "model": {"name_or_path": EMBEDDED_TINY, "dtype": "float32", "device": "cpu"},
        "data": {
            "source": EMBEDDED_TINY, "max_prompt_len": 96, "max_new_tokens": 48,
            "train_size": 1200, "val_size": 48, "test_size": 48,
        },
        "generate": {"num_actors": 2, "batch_size": 64, "num_cpus_per_actor": 0.5},
        "drafter": {"block_size": 8, "lora_r": 8, "lora_alpha": 16, "early_exit_layers": 2,
                    "optim": _tiny_optim(6e-3, max_steps=150)},
        "mtp": {"optim": _tiny_optim(3e-3, max_steps=100, warmup_ratio=0.05, weight_decay=0.1)},
        "training": {"num_workers": 2, "cpus_per_worker": 0.5, "zero_stage": 0,
                     "precision": "fp32"},
        "decoding": {"max_new_tokens": 48, "num_prompts": 16, "repeats": 2},
        "serving": {"model_name": "peftbd-tiny", "max_prompt_tokens": 256, "max_tokens_cap": 128},
    },
    "qwen3-0.6b": {
        "preset": "qwen3-0.6b",
        "model": {"name_or_path": "Qwen/Qwen3-0.6B", "dtype": "bfloat16", "device": "auto"},
        "data": {
            "source": "allenai/tulu-3-sft-mixture", "max_prompt_len": 512,
            "max_new_tokens": 256, "train_size": 50_000, "val_size": 1_000, "test_size": 1_000,
        },
        "generate": {"num_actors": 1, "batch_size": 64, "num_cpus_per_actor": 1,
                     "num_gpus_per_actor": 1},
        "drafter": {"block_size": 16, "denoise_steps": 1, "lora_r": 16, "lora_alpha": 32,
                    "lora_dropout": 0.0, "mask_ratio_min": 0.3, "mask_ratio_max": 1.0,
                    "prefix_gamma": 0.9, "early_exit_layers": 14,
                    "optim": {"lr": 2e-4, "warmup_ratio": 0.03, "weight_decay": 0.0,
                              "global_batch_size": 64, "max_steps": 10_000}},
        "mtp": {"num_steps": 3, "loss_weights": [0.51, 0.31, 0.18],
                "optim": {"lr": 5e-5, "warmup_ratio": 0.05, "weight_decay": 0.1,
                          "global_batch_size": 64, "max_steps": 10_000}},
        "training": {"num_workers": 1, "use_gpu": True, "cpus_per_worker": 4,
                     "zero_stage": 2, "precision": "bf16"},
        "decoding": {"max_new_tokens": 256, "num_prompts": 1_000, "repeats": 3,
                     "workers": 1, "worker_num_cpus": 4, "worker_num_gpus": 1,
                     "torch_threads": 0},
        "serving": {"model_name": "peftbd-qwen3-0.6b", "max_prompt_tokens": 512,
                    "max_tokens_cap": 256, "replica_num_cpus": 2, "drafter_num_gpus": 1,
                    "verifier_num_gpus": 1,
                    "placements": ["colocated", "split", "split-same-node",
                                   "split-cross-node", "split-fractional-gpu"]},
    },
}
