"""What the main job needs of the split sizes, checked before any stage runs.

`data.*_size` are valid on their own (a benchmark-only artifact has no train rows), but the
main job trains on the train split, evaluates on val and benchmarks on test, so sizes that make
a later stage fail (or publish untrained drafters) are refused up front, naming the key, the
value and the fix, instead of after generate has run.
"""

from __future__ import annotations

from peftbd.config import Config, ConfigError
from peftbd.untrained import OPT_IN


def check_main_job(cfg: Config) -> None:
    """Raise `ConfigError` for split sizes the main job's stages cannot use: no train rows
    (unless `training.allow_untrained`: the drafters are then published untrained), fewer train
    rows than one global batch of a drafter that trains, fewer val rows than training workers,
    no test rows."""
    d = cfg.data
    alone = "for a benchmark-only artifact run python -m jobs.generate alone"
    if d.train_size == 0 and not cfg.training.allow_untrained:
        raise ConfigError(
            "config key 'data.train_size': value 0 leaves the main job's drafters nothing to train "
            f"on (they would be published untrained); set data.train_size >= 1, or set {OPT_IN}=true "
            f"to publish them untrained on purpose ({alone})"
        )
    for key, optim in (("peftbd.optim", cfg.peftbd.optim), ("fastmtp.optim", cfg.fastmtp.optim),
                       ("peftbd_head.optim", cfg.peftbd_head.optim)):
        if d.train_size and optim.max_steps and d.train_size < optim.global_batch_size:
            raise ConfigError(
                f"config key 'data.train_size': value {d.train_size} is below one global batch of "
                f"{key}.global_batch_size={optim.global_batch_size}; raise data.train_size or lower "
                f"{key}.global_batch_size"
            )
    if d.val_size < cfg.training.num_workers:
        raise ConfigError(
            f"config key 'data.val_size': value {d.val_size} is below training.num_workers="
            f"{cfg.training.num_workers} (each training worker evaluates val rows); set "
            f"data.val_size >= {cfg.training.num_workers}"
        )
    if d.test_size == 0:
        raise ConfigError(
            "config key 'data.test_size': value 0 leaves the main job's benchmark no prompt; set "
            f"data.test_size >= 1 ({alone})"
        )
