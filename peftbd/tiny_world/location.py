"""Where a built tiny world lies, without building it: the resolvers (`peftbd.models.sources`,
`peftbd.data.sources`) locate the world; only the world stage (`peftbd.tiny_world.build`) builds
it. Kept apart from that stage's code, whose source is part of the world's fingerprint."""

from __future__ import annotations

from peftbd.config_sections import TinyWorldConfig
from peftbd.manifest import MANIFEST
from peftbd.stage import StageError
from peftbd.tiny_world.build import TinyWorld, tiny_world_dir


def locate_tiny_world(tw: TinyWorldConfig, cache_dir: str) -> TinyWorld:
    """The built tiny world of `tw` in the cache; one that is not there is refused, naming how
    to build it (its stage: `peftbd.process_setup.ready`, run by every job's command line)."""
    root = tiny_world_dir(tw, cache_dir)
    if not (root / MANIFEST).is_file():
        raise StageError(f"the tiny world of these settings is not built (no {root / MANIFEST}); "
                         "run its stage first: python -m jobs.pipeline, or any job's command line "
                         "(each runs the world stage before it starts)")
    return TinyWorld(root)
