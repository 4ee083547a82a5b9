"""Settings that would publish an untrained drafter, and the one opt-in that allows them.

A training job whose optimizer never changes the weights still exits 0 and publishes an
artifact that looks trained: `*.optim.max_steps = 0` (no step), `*.optim.lr = 0` (steps that
change nothing), `*.loss_weights` all 0 (no loss: `fastmtp.loss_weights`) or a train split with no rows
(`data.train_size = 0`). Each is refused, naming the key, the value and the fix, unless
`training.allow_untrained = true` asks for it; the artifact's manifest then says
`untrained: true` with these reasons (`untrained_reasons`), and the report names it.
"""

from __future__ import annotations

from peftbd.config_merge import ConfigError
from peftbd.config_sections import Config, OptimConfig

OPT_IN = "training.allow_untrained"


def trained_sections(cfg: Config) -> list[str]:
    """The config sections that train a drafter: those with an `optim` (peftbd, fastmtp, ...)."""
    return [name for name, section in cfg.sections.items()
            if isinstance(getattr(section, "optim", None), OptimConfig)]


def config_reasons(cfg: Config, section: str) -> list[tuple[str, object, str]]:
    """(key, value, why) of each setting of `cfg` that leaves the drafter `section` trains
    untrained."""
    part = getattr(cfg, section)
    found: list[tuple[str, object, str]] = []
    if part.optim.max_steps == 0:
        found.append((f"{section}.optim.max_steps", 0, "no optimizer step"))
    if part.optim.lr == 0:
        found.append((f"{section}.optim.lr", part.optim.lr, "every step leaves the weights as they are"))
    weights = getattr(part, "loss_weights", None)
    if weights is not None and not any(weights):
        found.append((f"{section}.loss_weights", list(weights), "no step has a loss"))
    return found


def untrained_reasons(cfg: Config, section: str, what: str, train_rows: int | None = None) -> list[str]:
    """Why the drafter `what` trained by `section` with `cfg` on `train_rows` usable rows would
    stay untrained (empty: it trains). Raises `ConfigError` for any reason unless
    `training.allow_untrained`."""
    reasons = [f"{key}={value!r} ({why})" for key, value, why in config_reasons(cfg, section)]
    if train_rows == 0:
        reasons.append(f"the train split has no usable rows (data.train_size={cfg.data.train_size})")
    if reasons and not cfg.training.allow_untrained:
        raise ConfigError(refusal(what, reasons))
    return reasons


def check_config(cfg: Config) -> None:
    """Refuse, at config load, every setting that would publish an untrained drafter (the first
    one found names its key and value) unless `training.allow_untrained` is set."""
    if cfg.training.allow_untrained:
        return
    for section in trained_sections(cfg):
        for key, value, why in config_reasons(cfg, section):
            raise ConfigError(
                f"config key {key!r}: value {value!r} would publish an untrained drafter "
                f"({why}); set a value that trains, or set {OPT_IN}=true to publish it untrained "
                f"on purpose (its manifest then says untrained)"
            )


def refusal(what: str, reasons: list[str]) -> str:
    return (f"the {what} would be published untrained: {'; '.join(reasons)}; fix the "
            f"setting, or set {OPT_IN}=true to publish it untrained on purpose (its manifest then "
            "says untrained)")
