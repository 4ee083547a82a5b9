"""Settings that would publish an untrained drafter (`peftbd.untrained`): each names its key and
value, and passes only when `training.allow_untrained` asks for it."""

import pytest

from peftbd.config import ConfigError, load_config


@pytest.mark.parametrize(("override", "section", "reason"), [
    ("peftbd.optim.max_steps=0", "peftbd", "peftbd.optim.max_steps=0 (no optimizer step)"),
    ("fastmtp.optim.max_steps=0", "fastmtp", "fastmtp.optim.max_steps=0 (no optimizer step)"),
    ("peftbd.optim.lr=0", "peftbd", "peftbd.optim.lr=0.0 (every step leaves the weights as they are)"),
    ("fastmtp.optim.lr=0.0", "fastmtp", "fastmtp.optim.lr=0.0 (every step leaves the weights as they are)"),
    ("fastmtp.loss_weights=[0, 0, 0]", "fastmtp", "fastmtp.loss_weights=[0.0, 0.0, 0.0] (no step has a loss)"),
    ("peftbd_head.optim.max_steps=0", "peftbd_head", "peftbd_head.optim.max_steps=0 (no optimizer step)"),
])
def test_untrained_settings_pass_when_asked_for_explicitly(override, section, reason):
    from peftbd.untrained import trained_sections, untrained_reasons

    cfg = load_config("tiny", overrides=[override, "training.allow_untrained=true"])
    assert untrained_reasons(cfg, section, "drafter", train_rows=100) == [reason]
    others = [s for s in trained_sections(cfg) if s != section]
    assert {"peftbd", "fastmtp", "peftbd_head", "dflash"} <= {section, *others}  # every section with an optimizer
    assert all(untrained_reasons(cfg, s, "drafter", train_rows=100) == [] for s in others)
    assert not load_config("tiny").training.allow_untrained  # off by default


def test_no_train_rows_is_an_untrained_reason_refused_unless_asked_for():
    from peftbd.untrained import untrained_reasons

    cfg = load_config("tiny", overrides=["data.train_size=0"])  # a benchmark-only artifact: fine
    with pytest.raises(ConfigError) as err:
        untrained_reasons(cfg, "fastmtp", "FastMTP head", train_rows=0)
    assert str(err.value) == (
        "the FastMTP head would be published untrained: the train split has no usable rows "
        "(data.train_size=0); fix the setting, or set training.allow_untrained=true to publish it "
        "untrained on purpose (its manifest then says untrained)")
    allowed = load_config("tiny", overrides=["data.train_size=0", "training.allow_untrained=true",
                                             "peftbd.optim.max_steps=0"])
    assert untrained_reasons(allowed, "peftbd", "PEFT-BD adapter", train_rows=0) == [
        "peftbd.optim.max_steps=0 (no optimizer step)",
        "the train split has no usable rows (data.train_size=0)"]
    assert untrained_reasons(load_config("tiny"), "peftbd", "PEFT-BD adapter", train_rows=5) == []
