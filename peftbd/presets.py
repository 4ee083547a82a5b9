"""The named presets: the YAML files in `peftbd/configs/` (`<name>.yaml`), each the complete
config tree with comments, for users to copy and edit. `peftbd.config` type-checks them like any
YAML file. `tiny` is the embedded world on CPU; `qwen3-0.6b` is the paper's setting."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

EMBEDDED_TINY = "embedded:tiny"
"""`model.name_or_path` / `data.source` value that selects the embedded tiny world."""

CONFIGS = resources.files("peftbd") / "configs"
"""The preset files (package data)."""

PRESETS: dict[str, dict[str, Any]] = {
    path.name.removesuffix(".yaml"): yaml.safe_load(path.read_text())
    for path in sorted(CONFIGS.iterdir(), key=lambda p: p.name)
    if path.name.endswith(".yaml")
}
