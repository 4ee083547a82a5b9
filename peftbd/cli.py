"""Shared command-line options: every job takes --preset, --config, --set; stage jobs also
--out and --force."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from peftbd.config import Config, ConfigError, load_config, preset_names
from peftbd.stage import Decision, StageSpec


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add --preset, --config and --set to a job's parser."""
    parser.add_argument(
        "--preset", default="tiny", choices=preset_names(),
        help="named configuration: 'tiny' is the embedded world (CPU, no network); "
        "'qwen3-0.6b' is the paper's setting (default: tiny)",
    )
    parser.add_argument(
        "--config", metavar="FILE.yaml", default=None,
        help="YAML file with the same sections as the config tree, applied over the preset",
    )
    parser.add_argument(
        "--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
        help="override one config value, e.g. --set drafter.block_size=16 "
        "--set data.train_size=2000 (repeatable; values parse as YAML)",
    )


def config_from_args(args: argparse.Namespace) -> Config:
    """Build the config from parsed args; a bad key or value exits with status 2 and the reason."""
    try:
        return load_config(args.preset, args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def output_root(cfg: Config) -> Path:
    """The main job's default output root: `<paths.out_dir>/<preset>`."""
    return Path(cfg.paths.out_dir) / cfg.preset


def add_stage_args(parser: argparse.ArgumentParser, spec: StageSpec) -> None:
    """Add a stage job's --out (default: the main job's layout) and --force."""
    parser.add_argument(
        "--out", type=Path, default=None,
        help=f"output directory (default: <paths.out_dir>/<preset>/{spec.subdir}, the main job's layout)",
    )
    add_force_arg(parser)


def add_force_arg(parser: argparse.ArgumentParser) -> None:
    """Add --force: rebuild a stage's output although it is current."""
    parser.add_argument(
        "--force", action="store_true",
        help="rebuild even when the output is current (its inputs, config and code unchanged)",
    )


def stage_out(args: argparse.Namespace, cfg: Config, spec: StageSpec) -> Path:
    """--out, or the stage's directory in the main job's layout."""
    return args.out or output_root(cfg) / spec.subdir


def decision_line(spec: StageSpec, out: Path, decision: Decision) -> str:
    """One line saying what a stage job did and why."""
    done = f"built ({decision.describe()})" if decision.run else "current, skipped (inputs unchanged)"
    return f"{spec.name}: {done} -> {out.resolve()}"
