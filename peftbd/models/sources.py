"""Where the verifier and its tokenizer come from (hub id, local directory, the embedded tiny
world, or random weights at an architecture), and the error that says how to fix a missing one."""

from __future__ import annotations

from pathlib import Path

from peftbd.config import EMBEDDED_TINY, RANDOM_WEIGHTS, Config
from peftbd.errors import UserError
from peftbd.tiny_world.location import locate_tiny_world


class ModelUnavailableError(UserError, RuntimeError):
    """The configured model or tokenizer cannot be loaded; the message says how to fix it."""


def model_dirs(cfg: Config) -> tuple[str, str]:
    """(tokenizer source, model source): hub ids or local paths, resolved, nothing built (the
    world stage builds the tiny world: `peftbd.process_setup.ready`); a `random:` model's
    tokenizer is the tiny world's, its model source the name itself."""
    name = cfg.model.name_or_path
    if name == EMBEDDED_TINY or name.startswith(RANDOM_WEIGHTS):
        world = locate_tiny_world(cfg.tiny_world, cfg.paths.cache_dir)
        return str(world.tokenizer_dir), name if name.startswith(RANDOM_WEIGHTS) else str(world.verifier_dir)
    return name, name


def unavailable_error(name: str, preset: str, what: str, exc: Exception) -> ModelUnavailableError:
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
