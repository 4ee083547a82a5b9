"""The synthetic arms `decoding.synthetic` declares: ids, labels, profiles and one-line errors."""

from __future__ import annotations

import pytest

from peftbd.benchmarking.arms import arm_specs
from peftbd.config import ConfigError, load_config


def test_each_entry_adds_a_labelled_synthetic_twin_of_its_arm():
    cfg = load_config("tiny")
    specs = {s.id: s for s in arm_specs(cfg)}
    assert [i for i in specs if i.endswith("_synthetic")] == \
        ["peftbd_synthetic", "fastmtp_synthetic", "peftbd_head_synthetic"]
    twin, real = specs["peftbd_synthetic"], specs["peftbd"]
    assert twin.method == real.method and twin.stage == real.stage
    assert "[synthetic: 2.881/round]" in twin.label and twin.settings()["synthetic"] == 2.881
    assert twin.profile().expected_emitted() == pytest.approx(2.881)
    assert len(twin.profile().conditional) == cfg.peftbd.block_size
    assert len(specs["fastmtp_synthetic"].profile().conditional) == cfg.fastmtp.num_steps
    assert real.profile() is None


@pytest.mark.parametrize("entry,message", [
    ("nothing=2.0", "names no drafting arm of this run; use one of peftbd"),
    ("ar=2.0", "names no drafting arm"),
    ("fastmtp=4.5", "use 1 .. 4"),
    ("peftbd:2", "expected arm=tokens_per_round"),
])
def test_a_bad_entry_is_one_config_error_naming_the_key(entry, message):
    with pytest.raises(ConfigError, match="decoding.synthetic") as err:
        arm_specs(load_config("tiny", overrides=[f"decoding.synthetic=[{entry}]"]))
    assert message in str(err.value)


def test_synthetic_arms_need_an_oracle():
    from peftbd.benchmarking.arms import ArmModels

    spec = next(s for s in arm_specs(load_config("tiny")) if s.id == "fastmtp_synthetic")
    models = ArmModels(verifier=None, eos_ids=[], ctx=None)
    with pytest.raises(ValueError, match="needs an oracle"):
        models.drafter_for(spec)
