"""The named presets: the YAML files in `peftbd/configs/` (`<name>.yaml`), each the complete
config tree with comments, for users to copy and edit. `peftbd.config` type-checks them like any
YAML file. `tiny` is the embedded world on CPU; `tiny-full` is `tiny` plus the ablations that
train drafters of their own (it `extends: tiny`, naming only what it changes); `qwen3-0.6b` is
the paper's setting."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

EMBEDDED_TINY = "embedded:tiny"
"""`model.name_or_path` / `data.source` value that selects the embedded tiny world."""

RANDOM_WEIGHTS = "random:"
"""`model.name_or_path` prefix: `random:<architecture>` (as `cost_profile.architecture`, e.g.
random:Qwen/Qwen3-0.6B) is that architecture with random weights seeded by `training.seed` (the
same in every process) and the tiny world's tokenizer: real cost at a model's shape, e.g. for
serving and placement (cost does not depend on the weights' values), meaningless text."""

CONFIGS = resources.files("peftbd") / "configs"
"""The preset files (package data)."""

EXTENDS = "extends"
"""A preset file's key naming the preset it changes: its other keys are merged onto that one's."""


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = (deep_merge(base[key], value)
                    if isinstance(value, dict) and isinstance(base.get(key), dict) else value)
    return out


def _resolve(files: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each preset's complete tree: a file with `extends: NAME` merged onto NAME's (one level)."""
    out = {}
    for name, tree in files.items():
        base = tree.get(EXTENDS)
        if base is not None and (base not in files or EXTENDS in files[base]):
            raise ValueError(f"preset {name!r}: extends {base!r}, which is not a complete preset "
                             f"({', '.join(n for n in files if EXTENDS not in files[n])})")
        changes = {k: v for k, v in tree.items() if k != EXTENDS}
        out[name] = deep_merge(files[base], changes) if base else changes
    return out


PRESETS: dict[str, dict[str, Any]] = _resolve({
    path.name.removesuffix(".yaml"): yaml.safe_load(path.read_text())
    for path in sorted(CONFIGS.iterdir(), key=lambda p: p.name)
    if path.name.endswith(".yaml")
})
