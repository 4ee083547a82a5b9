"""One tree of frozen dataclasses for every stage, named presets, YAML files and `--set` overrides.

The tree is `Config`, one section per stage (`peftbd.config_sections`, re-exported here).

Each registered drafting method (`peftbd.methods`) brings its own section, keyed by its id
(`peftbd`, `fastmtp`, ...): its values come from the method (`Method.defaults`), then whatever the
layers below set. `methods.plugins` names modules that register more methods: they are imported
before the sections are built, in every process that loads the config.

A config is built in three layers: a named preset (`tiny`, `qwen3-0.6b`: the YAML files in
`peftbd/configs/`), then an optional YAML file (a nested mapping with the same keys), then
`--set a.b=value` overrides. The preset sets every field (the sections have no defaults); every
layer is type-checked against the dataclass fields (`Literal` fields accept only their listed
values); the finished config is checked against each field's rule (its annotation's `Range`,
`Form` or `DISTINCT`) and its section's `ORDERED` and `LENGTHS`, and settings that
would publish an untrained drafter are refused unless `training.allow_untrained`
(`peftbd.untrained`). An unknown key or a bad value raises `ConfigError` naming the key, the
value and the allowed form.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import typing
from pathlib import Path
from typing import Any

import yaml

from peftbd.config_merge import ConfigError, build, merge
from peftbd.config_sections import (
    DISTINCT,
    Config,
    CostProfileConfig,
    DataConfig,
    DecodingConfig,
    DrafterConfig,
    Form,
    GenerateConfig,
    HeadConfig,
    ModelConfig,
    MTPConfig,
    OptimConfig,
    PathsConfig,
    Range,
    ServingConfig,
    TinyWorldConfig,
    TrainingConfig,
)
from peftbd.method_catalog import entries, renamed
from peftbd.presets import EMBEDDED_TINY, PRESETS, RANDOM_WEIGHTS, deep_merge as _deep_merge
from peftbd.untrained import check_config as _check_untrained

__all__ = [  # the sections and EMBEDDED_TINY are re-exported: import them from here
    "EMBEDDED_TINY", "RANDOM_WEIGHTS", "Config", "ConfigError", "CostProfileConfig", "DataConfig", "DecodingConfig",
    "DrafterConfig", "GenerateConfig", "HeadConfig", "MTPConfig", "ModelConfig", "OptimConfig",
    "PathsConfig", "ServingConfig", "TinyWorldConfig", "TrainingConfig", "apply_override",
    "build_config", "cache_root", "cpu_only", "import_plugins", "load_config", "load_plugins",
    "merge_config",
    "preset_names", "save_config",
]


def cache_root(cache_dir: str) -> Path:
    """The cache directory: env `PEFTBD_CACHE` when set, else `cache_dir` (`paths.cache_dir`)."""
    return Path(os.environ.get("PEFTBD_CACHE", cache_dir)).expanduser()


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
    file_tree = _read_yaml(Path(config_file)) if config_file is not None else {}
    import_plugins(_plugins(PRESETS[preset], file_tree, overrides))
    cfg = build_config(PRESETS[preset])
    cfg = merge_config(cfg, file_tree)
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
    return merge_config(cfg, nested)


def load_plugins(preset: str = "tiny", config_file: str | Path | None = None,
                 overrides: typing.Sequence[str] = ()) -> None:
    """Import the methods the config these layers build would name (`methods.plugins`), before
    anything reads the registry (e.g. a Serve app's arguments, which name methods)."""
    if preset in PRESETS:
        file_tree = _read_yaml(Path(config_file)) if config_file is not None else {}
        import_plugins(_plugins(PRESETS[preset], file_tree, overrides))


def import_plugins(names: typing.Iterable[str]) -> None:
    """Import the built-in methods and each `methods.plugins` module (each registers its own);
    one that cannot be imported is refused, naming it and how to make it importable."""
    entries()  # the built-in methods
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(f"config key 'methods.plugins': cannot import {name!r} ({exc}); put "
                              "its directory on PYTHONPATH (Ray workers inherit it) or install it") from exc


def build_config(tree: dict[str, Any]) -> Config:
    """A complete config from a preset's tree: its core sections, and every registered method's
    section from the method's defaults with the tree's values on top."""
    core, parts = _split(tree)
    cfg = build(Config, core)
    sections: dict[str, Any] = {m.id: build(m.config, _deep_merge(dict(m.defaults), parts.get(m.id, {})), f"{m.id}.")
                for m in entries()}
    return dataclasses.replace(cfg, sections=sections)


def merge_config(cfg: Config, tree: dict[str, Any]) -> Config:
    """`cfg` with a partial tree (a YAML file, an override) applied, method sections included."""
    core, parts = _split(tree)
    cfg = merge(cfg, core, prefix="")
    for method_id, part in parts.items():
        cfg = cfg.with_section(method_id, merge(getattr(cfg, method_id), part, prefix=f"{method_id}."))
    return cfg


def _split(tree: dict[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(the tree's core sections, its method sections by id); a method's former section name or
    an unknown key is refused, naming what to write instead."""
    core_keys = [f.name for f in dataclasses.fields(Config) if f.name != "sections"]
    known = {m.id: m for m in entries()}
    ids = list(known)
    core, parts = {}, {}
    for key, value in tree.items():
        if key in core_keys:
            core[key] = value
        elif key in ids:
            if not isinstance(value, dict):
                raise ConfigError(f"config key {key!r} is a section; set one of its fields "
                                  f"instead, e.g. {key}.{dataclasses.fields(known[key].config)[0].name}=...")
            parts[key] = value
        elif (new := renamed(key)) is not None:
            raise ConfigError(f"config section {key!r} was renamed to {new!r}")
        else:
            raise ConfigError(f"unknown config key {key!r}; sections: {', '.join([*core_keys, *ids])} "
                              "(a plugin method's section needs its module in methods.plugins)")
    return core, parts


def _plugins(preset: dict[str, Any], file_tree: dict[str, Any], overrides: typing.Sequence[str]) -> list[str]:
    """`methods.plugins` as the layers set it (the last one that sets it wins)."""
    found: Any = []
    for tree in (preset, file_tree):
        section = tree.get("methods")
        if isinstance(section, dict) and "plugins" in section:
            found = section["plugins"] or []
    for item in overrides:
        key, _, raw = item.partition("=")
        if key.strip() == "methods.plugins":
            found = yaml.safe_load(raw) or []
    if isinstance(found, str):
        found = [found]
    if not isinstance(found, list) or not all(isinstance(n, str) for n in found):
        raise ConfigError(f"config key 'methods.plugins': value {found!r} is not valid; expected a "
                          "list of importable module names, e.g. [my_pkg.my_drafter]")
    return found


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
    """Check a finished config (section) against its fields' rules (lists' entries first, then
    each field in order, sections recursively), then `_ORDERED` and `_LENGTHS`."""
    rules = _rules(type(obj))
    for name, (_, item) in rules.items():
        value = getattr(obj, name)
        for rule in item:
            if isinstance(rule, Range) and (bad := [v for v in value if not _within(v, rule)]):
                raise ConfigError(f"config key '{prefix}{name}': value {list(value)!r} holds "
                                  f"{bad[0]!r}; expected every entry {_allowed(rule)}")
            if isinstance(rule, Form) and (bad := [v for v in value
                                                   if not re.fullmatch(rule.pattern, v)]):
                raise ConfigError(f"config key '{prefix}{name}': entry {bad[0]!r} is not valid; "
                                  f"expected {rule.words}")
    for name in (name for name, (own, _) in rules.items() if DISTINCT in own):
        value = list(getattr(obj, name))
        if not value or len(set(value)) != len(value):
            raise ConfigError(f"config key '{prefix}{name}': value {value!r} must hold at least one "
                              "entry and none twice, e.g. [1, 4, 16]")
    if isinstance(obj, Config):
        for method_id, section in obj.sections.items():
            _check_values(section, f"{method_id}.")
    for f in dataclasses.fields(obj):
        key, value = f"{prefix}{f.name}", getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _check_values(value, f"{key}.")
        for rule in rules[f.name][0]:
            if isinstance(rule, Range) and not _within(value, rule):
                raise ConfigError(
                    f"config key {key!r}: value {value!r} is out of range; expected {_allowed(rule)}"
                )
            if isinstance(rule, Form) and not re.fullmatch(rule.pattern, value):
                raise ConfigError(
                    f"config key {key!r}: value {value!r} is not valid; expected {rule.words}"
                )
    for first, second in getattr(type(obj), "ORDERED", ()):
        low, high = getattr(obj, first), getattr(obj, second)
        if low > high:
            raise ConfigError(
                f"config key '{prefix}{first}': value {low!r} exceeds '{prefix}{second}' "
                f"({high!r}); expected {first} <= {second}"
            )
    for items, count in getattr(type(obj), "LENGTHS", ()):
        value, want = getattr(obj, items), getattr(obj, count)
        if len(value) != want:
            raise ConfigError(
                f"config key '{prefix}{items}': value {list(value)!r} has {len(value)} entries; "
                f"expected one per '{prefix}{count}' ({want})"
            )


def _rules(section: type) -> dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """Per field of `section`: (its own rules, its list entries' rules), from the annotations."""
    out = {}
    for name, hint in typing.get_type_hints(section, include_extras=True).items():
        own, base = _metadata(hint)
        item = _metadata(typing.get_args(base)[0])[0] if typing.get_origin(base) is tuple else ()
        out[name] = (own, item)
    return out


def _metadata(hint: Any) -> tuple[tuple[Any, ...], Any]:
    """(the `Annotated` rules of `hint`, the type under them)."""
    if typing.get_origin(hint) is typing.Annotated:
        return hint.__metadata__, typing.get_args(hint)[0]
    return (), hint


def _within(value: float, rule: Range) -> bool:
    return (rule.low is None or value >= rule.low) and (rule.high is None or value <= rule.high)


def _allowed(rule: Range) -> str:
    return f">= {rule.low}" if rule.high is None else f"in [{rule.low}, {rule.high}]"
