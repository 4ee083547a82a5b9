"""Shared command-line options: every job takes --preset, --config, --set and --out."""

from __future__ import annotations

import argparse
import sys

from peftbd.config import Config, ConfigError, load_config, preset_names


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
