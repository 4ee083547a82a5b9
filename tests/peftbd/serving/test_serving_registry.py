"""A method registered with `register(Method(...))` is served with no serving code of its own: a
toy one (FastMTP's drafter under a new name, its own Serve argument, arm and draft positions)
loads through `load_serving_models`, decodes greedy AR's output in the colocated loop, takes its
trained dir from its own `<dir_arg>`, and controlled acceptance from its positions."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from peftbd.config import ConfigError
from peftbd.data.chat import encode_prompt
from peftbd.decoding import decode
from peftbd.layout import training_stage
from peftbd.methods import AR, ArmSpec, Former, by_serving, register, serving_names, unregister
from peftbd.serving.replica import ReplicaDecoder

TOY, STEPS, MAX_NEW = "toy", 2, 16


@pytest.fixture(scope="module")
def toy():
    """The toy method, registered for this module only."""
    stage = training_stage(TOY, "toy head")
    method = register(dataclasses.replace(
        by_serving("fastmtp"), id=TOY, label="Toy", what="toy MTP head",
        stages=(stage,), positions=lambda cfg: STEPS, former=Former(),
        arms=lambda cfg: [ArmSpec("toy", f"Toy ({STEPS} steps)", "toy", stage=stage.name,
                                  mtp_steps=STEPS)]))
    try:
        yield method
    finally:
        unregister(method.id)


@pytest.fixture(scope="module")
def prompt(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_cfg)
    return encode_prompt(tok, [{"role": "user", "content": "Describe the for statement."}])


def test_a_registered_method_is_served_colocated_with_the_engine_output(toy, tiny_cfg, prompt,
                                                                        tmp_path, caplog):
    from peftbd.models.loading import load_verifier
    from peftbd.models.mtp_head import MTPHead
    from peftbd.serving.models import load_serving_models
    from peftbd.serving.validation import served_model_ids

    assert serving_names()[-1] == TOY and f"m:{TOY}" in served_model_ids("m")
    with caplog.at_level(logging.INFO, logger="peftbd.serving.models"):
        untrained = load_serving_models(tiny_cfg, (AR, TOY))
    assert "no toy_dir" in caplog.text
    MTPHead(load_verifier(tiny_cfg)).save_pretrained(tmp_path)
    trained = load_serving_models(tiny_cfg, (AR, TOY), {TOY: tmp_path})
    reference = decode(trained.model, prompt, None, MAX_NEW, trained.eos_ids).tokens
    for models in (untrained, trained):
        assert models.decoder(TOY).drafter.num_steps == STEPS  # its arm's, not fastmtp.num_steps
        events = list(ReplicaDecoder(models, 4).rounds(prompt, MAX_NEW, TOY))
        assert [t for e in events for t in e.tokens] == reference
        assert max(e.proposed for e in events) == STEPS
    assert trained.shipped[TOY] == "hidden"  # a split verifier ships what it reads


def test_its_own_serve_argument_and_synthetic_rate(toy, tiny_cfg):
    from peftbd.serving.synthetic import synthetic_rates
    from serve_apps.args import AppArgs

    assert AppArgs.model_validate({"toy_dir": "/t", "peftbd_head_dir": None}).drafter_dirs == {TOY: "/t"}
    assert synthetic_rates(dataclasses.replace(tiny_cfg, serving=dataclasses.replace(
        tiny_cfg.serving, synthetic=(f"{TOY}=2.5",)))) == {TOY: 2.5}
    with pytest.raises(ConfigError, match=r"use 1 \.\. 3"):  # its 2 positions + the bonus
        synthetic_rates(dataclasses.replace(tiny_cfg, serving=dataclasses.replace(
            tiny_cfg.serving, synthetic=(f"{TOY}=3.5",))))
