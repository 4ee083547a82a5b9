"""Settings that would publish an untrained drafter, and the one opt-in that allows them.

A training job whose optimizer never changes the weights still exits 0 and publishes an
artifact that looks trained: `*.optim.max_steps = 0` (no step), `*.optim.lr = 0` (steps that
change nothing), `mtp.loss_weights` all 0 (no loss) or a train split with no rows
(`data.train_size = 0`). Each is refused, naming the key, the value and the fix, unless
`training.allow_untrained = true` asks for it; the artifact's manifest then says
`untrained: true` with these reasons (`untrained_reasons`), and the report names it.
"""

from __future__ import annotations

from typing import Literal

from peftbd.config_merge import ConfigError
from peftbd.config_sections import Config

Kind = Literal["peftbd", "mtp", "head"]
KINDS: tuple[Kind, ...] = ("peftbd", "mtp", "head")
OPT_IN = "training.allow_untrained"
_WHAT = {"peftbd": "PEFT-BD adapter", "mtp": "FastMTP head", "head": "block-diffusion head"}
_SECTION = {"peftbd": "drafter", "mtp": "mtp", "head": "head"}


def config_reasons(cfg: Config, kind: Kind) -> list[tuple[str, object, str]]:
    """(key, value, why) of each setting of `cfg` that leaves the `kind` drafter untrained."""
    section = _SECTION[kind]
    optim = getattr(cfg, section).optim
    found: list[tuple[str, object, str]] = []
    if optim.max_steps == 0:
        found.append((f"{section}.optim.max_steps", 0, "no optimizer step"))
    if optim.lr == 0:
        found.append((f"{section}.optim.lr", optim.lr, "every step leaves the weights as they are"))
    if kind == "mtp" and not any(cfg.mtp.loss_weights):
        found.append(("mtp.loss_weights", list(cfg.mtp.loss_weights), "no step has a loss"))
    return found


def untrained_reasons(cfg: Config, kind: Kind, train_rows: int | None = None) -> list[str]:
    """Why the `kind` drafter trained with `cfg` on `train_rows` usable rows would stay untrained
    (empty: it trains). Raises `ConfigError` for any reason unless `training.allow_untrained`."""
    reasons = [f"{key}={value!r} ({why})" for key, value, why in config_reasons(cfg, kind)]
    if train_rows == 0:
        reasons.append(f"the train split has no usable rows (data.train_size={cfg.data.train_size})")
    if reasons and not cfg.training.allow_untrained:
        raise ConfigError(refusal(kind, reasons))
    return reasons


def check_config(cfg: Config) -> None:
    """Refuse, at config load, every setting that would publish an untrained drafter (the first
    one found names its key and value) unless `training.allow_untrained` is set."""
    if cfg.training.allow_untrained:
        return
    for kind in KINDS:
        for key, value, why in config_reasons(cfg, kind):
            raise ConfigError(
                f"config key {key!r}: value {value!r} would publish an untrained {_WHAT[kind]} "
                f"({why}); set a value that trains, or set {OPT_IN}=true to publish it untrained "
                f"on purpose (its manifest then says untrained)"
            )


def refusal(kind: Kind, reasons: list[str]) -> str:
    return (f"the {_WHAT[kind]} would be published untrained: {'; '.join(reasons)}; fix the "
            f"setting, or set {OPT_IN}=true to publish it untrained on purpose (its manifest then "
            "says untrained)")
