"""Sampled requests in the replicas: a seeded request's output is the engine's for the same seed,
colocated or split, also when a replica rebuilds its state mid-way; synthetic methods refuse
sampling; metrics band the temperature."""

from __future__ import annotations

import pytest

from peftbd.data.chat import encode_prompt
from peftbd.decoding import SamplingParams
from peftbd.methods import serving_names
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.rounds import temperature_band
from peftbd.serving.synthetic import check_sampled
from peftbd.serving.validation import GenerationSpec, RequestError

from .split_local import LocalCalls, split_decode

MAX_NEW = 24
SAMPLING = SamplingParams(temperature=1.0, top_p=0.95, seed=5)


@pytest.fixture(scope="module")
def models(tiny_cfg):
    from peftbd.serving.models import load_serving_models

    return load_serving_models(tiny_cfg)


@pytest.fixture(scope="module")
def prompt(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    return encode_prompt(load_tokenizer(tiny_cfg), [{"role": "user", "content": "Say something."}])


def _split(models, prompt, method, sampling, lose_verifier_at: int | None = None) -> list[int]:
    calls = LocalCalls(ReplicaDecoder(models, 4))
    return split_decode(models, calls, prompt, method, MAX_NEW, sampling, lose_verifier_at)[0]


@pytest.mark.parametrize("method", serving_names())
def test_a_seeded_sample_is_the_engines_colocated_and_split(models, prompt, method):
    engine = models.decoder(method).decode_many([prompt], 1, MAX_NEW, SAMPLING)[0].tokens
    greedy = models.decoder(method).decode(prompt, MAX_NEW).tokens
    assert engine != greedy  # it sampled
    colocated = [t for e in ReplicaDecoder(models, 4).rounds(prompt, MAX_NEW, method,
                                                             sampling=SAMPLING) for t in e.tokens]
    assert colocated == engine
    assert _split(models, prompt, method, SAMPLING) == engine
    assert _split(models, prompt, method, SAMPLING, lose_verifier_at=2) == engine  # resumed


def test_synthetic_methods_refuse_sampling():
    spec = GenerationSpec("r", "chat", "m", "peftbd", [1], 4, False, False,
                          sampling=SamplingParams(temperature=0.5, seed=1))
    with pytest.raises(RequestError, match="controlled acceptance") as err:
        check_sampled(spec, {"peftbd": 2.881})
    assert err.value.param == "temperature"
    check_sampled(spec, {"fastmtp": 2.0})  # another method's rate: fine


def test_temperature_bands():
    assert [temperature_band(t) for t in (0, 1e-6, 0.3, 0.5, 0.7, 1.0, 1.5)] == [
        "0", "0", "(0,0.5]", "(0,0.5]", "(0.5,1]", "(0.5,1]", "(1,2]"]
