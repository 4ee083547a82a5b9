"""A split Verifier keeps, for the block-diffusion head and DFlash (`ServingModels.feature_layers`,
what its remote drafters ship), the feature layers their drafters read, from a saved head's json
or from the config section, building no drafter of a method the replica does not serve
(`Method.feature_layers`); and a method that ships features must declare that hook."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from peftbd.methods import AR, Former, by_serving, register, serving_names
from peftbd.models.bd_head import HEAD_SUBDIR, BDHead, HeadShape

HEAD, DFLASH = by_serving("peftbd_head").serving, by_serving("dflash").serving
READERS = (HEAD, DFLASH)
SAVED = {HEAD: (0, 2), DFLASH: (1,)}
"""Each saved head's own feature layers (neither section's)."""


@pytest.fixture(scope="module")
def saved(tiny_cfg, tmp_path_factory):
    """Per method, a training run's output dir holding a head saved for the tiny verifier."""
    from peftbd.models.loading import load_tokenizer, load_verifier

    verifier = load_verifier(tiny_cfg)
    mask_id = load_tokenizer(tiny_cfg).mask_token_id
    dirs = {}
    for name, layers in SAVED.items():
        dirs[name] = tmp_path_factory.mktemp(name)
        BDHead(verifier, HeadShape(1, 64, layers, mask_id)).save_pretrained(dirs[name] / HEAD_SUBDIR)
    return dirs


@pytest.fixture(scope="module", params=["saved", "untrained"])
def dirs(request, saved):
    return saved if request.param == "saved" else {}


@pytest.fixture(scope="module")
def expected(tiny_cfg, dirs):
    """The feature layers of each drafter, built (both served by one replica)."""
    from peftbd.serving.models import load_serving_models

    models = load_serving_models(tiny_cfg, READERS, dirs)
    layers = {n: models.decoder(n).drafter.feature_layers for n in READERS}
    assert {n: models.feature_layers[n] for n in READERS} == layers
    if dirs:
        assert layers == SAVED
    return layers


@pytest.mark.parametrize("served", [(AR,), (AR, HEAD), (AR, DFLASH)])
def test_a_split_verifier_keeps_the_drafters_layers_building_none_it_does_not_serve(
        tiny_cfg, dirs, expected, served, monkeypatch, caplog):
    from peftbd.serving import models as serving

    build = serving._build_drafter

    def only_served(m, ctx, path):
        assert m.serving in served, f"built the {m.serving} drafter for its feature layers"
        return build(m, ctx, path)

    def no_head(*args, **kwargs):
        raise AssertionError("built a head for its feature layers")

    monkeypatch.setattr(serving, "_build_drafter", only_served)
    if not set(served) & set(READERS):
        monkeypatch.setattr(BDHead, "__init__", no_head)  # nor inside `Method.feature_layers`
    with caplog.at_level(logging.INFO, logger="peftbd.serving.models"):
        models = serving.load_serving_models(tiny_cfg, served, dirs)
    assert models.feature_layers == expected
    assert {n: models.remote_decoder(n, None).drafter.feature_layers for n in READERS} == expected
    unserved = [by_serving(n).dir_arg for n in READERS if n not in served]
    assert not [line for line in caplog.messages if any(arg in line for arg in unserved)]


def test_a_saved_head_for_another_verifier_is_refused_by_its_feature_layers(tiny_cfg, saved):
    from peftbd.methods import DraftContext
    from peftbd.models.loading import load_tokenizer, load_verifier

    verifier = load_verifier(tiny_cfg)
    ctx = DraftContext(tiny_cfg, verifier, load_tokenizer(tiny_cfg).mask_token_id, 0)
    read = by_serving(HEAD).feature_layers
    assert read is not None and read(ctx, saved[HEAD]) == SAVED[HEAD]
    verifier.config.num_hidden_layers += 1
    try:
        with pytest.raises(ValueError, match="trained for verifier shape"):
            read(ctx, saved[HEAD])
    finally:
        verifier.config.num_hidden_layers -= 1


def test_a_method_that_ships_features_must_declare_its_feature_layers():
    toy = dataclasses.replace(by_serving(HEAD), id="toy_features", stages=(), task=None,
                              feature_layers=None, former=Former())
    with pytest.raises(ValueError, match=r"'toy_features'.*Method\.feature_layers"):
        register(toy)
    assert "toy_features" not in serving_names()
