"""Controlled ("synthetic") acceptance in the Serve apps (`serving.synthetic`).

Each "method=tokens" entry makes that method's drafter a `ControlledDrafter`: its forwards are
real, its acceptance is `tokens` per round (geometric over its draft positions), verification is
real, so every answer is still the verifier's greedy output. Usage (`speculative.synthetic`) and
the Prometheus `method` tag say so, so no one reads a chosen acceptance as a measured one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from peftbd.config import Config, ConfigError
from peftbd.decoding.controlled import AcceptanceProfile
from peftbd.method_catalog import rename_hint
from peftbd.methods import by_serving, methods
from peftbd.serving.validation import GenerationSpec, RequestError


def draft_positions(cfg: Config, method: str) -> int:
    """How many tokens `method`'s drafter proposes a round (the profile's positions)."""
    return by_serving(method).positions(cfg)


def synthetic_rates(cfg: Config) -> dict[str, float]:
    """{method: tokens per round} of `serving.synthetic`; a clear error for a method that is not
    a drafting one, named twice, or a rate its draft positions cannot reach."""
    rates: dict[str, float] = {}
    drafting = [m.serving for m in methods()]
    for entry in cfg.serving.synthetic:
        method, _, tokens = entry.partition("=")
        if method not in drafting:
            raise ConfigError(f"config key 'serving.synthetic': entry {entry!r} names no drafting "
                              f"method{rename_hint(method)}; use one of {', '.join(drafting)}")
        if method in rates:
            raise ConfigError(f"config key 'serving.synthetic': {method!r} is named twice; keep one")
        positions = draft_positions(cfg, method)
        if not 1.0 <= float(tokens) <= positions + 1:
            raise ConfigError(f"config key 'serving.synthetic': entry {entry!r} asks for more "
                              f"tokens per round than {method}'s {positions} draft positions and "
                              f"the bonus can give; use 1 .. {positions + 1}")
        rates[method] = float(tokens)
    return rates


def synthetic_profiles(cfg: Config) -> dict[str, AcceptanceProfile]:
    """The acceptance profile of each synthetic method."""
    return {m: AcceptanceProfile.with_mean(r, draft_positions(cfg, m))
            for m, r in synthetic_rates(cfg).items()}


def check_sampled(spec: GenerationSpec, rates: dict[str, float]) -> None:
    """400 for a sampled request of a synthetic method: controlled acceptance forces drafts to
    greedy AR's tokens, which a sampled output does not follow."""
    if spec.method in rates and not spec.sampling.greedy:
        raise RequestError(
            f"method {spec.method!r} is served at controlled acceptance (serving.synthetic), which "
            "needs greedy decoding: send temperature 0 (or omit it), or pick another method",
            param="temperature")


def method_label(method: str, rates: dict[str, float]) -> str:
    """How metrics name `method`: itself, or "<method> [synthetic: N/round]"."""
    return f"{method} [synthetic: {rates[method]:g}/round]" if method in rates else method


def read_references(path: Path) -> dict[tuple[int, ...], Sequence[int]]:
    """{prompt ids: greedy AR output} from a references file ({"references": [{"prompt": ids,
    "output": ids}, ...]}); a clear error for a file of another shape."""
    try:
        items = json.loads(path.read_text())["references"]
        return {tuple(int(t) for t in r["prompt"]): [int(t) for t in r["output"]] for r in items}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"references file {path}: {exc!r}; expected JSON "
                          '{"references": [{"prompt": [ids], "output": [ids]}, ...]}') from exc


def write_references(path: Path, outputs: Mapping[tuple[int, ...], Sequence[int]]) -> None:
    """Write `read_references`'s file."""
    path.write_text(json.dumps({"references": [{"prompt": list(p), "output": list(o)}
                                               for p, o in outputs.items()]}))
