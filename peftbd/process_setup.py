"""What every process that loads a config does before it reads a method or a model: import the
config's `methods.plugins` (so their methods are registered here too) and run the world stage
when the config uses the embedded tiny world (a no-op once the world is in the cache; resolvers
such as `peftbd.models.sources.model_dirs` only locate it). Job command lines, Serve replicas,
Ray Train workers and the benchmark's and cost profile's Ray tasks call `ready` first."""

from __future__ import annotations

from peftbd.config import RANDOM_WEIGHTS, Config, import_plugins
from peftbd.tiny_world.build import ensure_tiny_world, uses_tiny_world


def ready(cfg: Config) -> Config:
    """Make this process ready for `cfg`: its plugins imported, its tiny world built. Returns it."""
    import_plugins(cfg.methods.plugins)
    if uses_tiny_world(cfg) or cfg.model.name_or_path.startswith(RANDOM_WEIGHTS):
        ensure_tiny_world(cfg.tiny_world, cfg.paths.cache_dir)
    return cfg
