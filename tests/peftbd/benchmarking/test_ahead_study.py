"""The guess study: counts that nest (hits within rounds), the same on a rerun, a clear refusal for a drafter that cannot draft ahead, and the job's JSON."""

from __future__ import annotations

import json

import pytest

from jobs.ahead_study import main
from peftbd.benchmarking.ahead_study import guess_study
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.models.loading import load_tokenizer
from peftbd.serving.models import load_serving_models


@pytest.fixture(scope="module")
def setup(tiny_cfg):
    models = load_serving_models(tiny_cfg, ["peftbd", "fastmtp"])
    prompts = first_prompts(load_tokenizer(tiny_cfg), resolve_source(tiny_cfg), 3, 256)
    return models, prompts


def test_the_counts_nest_and_repeat(setup):
    models, prompts = setup
    study = guess_study(models.decoder("peftbd"), prompts, 24)
    assert 0 <= study.hits <= study.rounds and study.rounds > 0
    assert study.hit_rate == study.hits / study.rounds
    assert guess_study(models.decoder("peftbd"), prompts, 24) == study


def test_a_drafter_that_cannot_draft_ahead_is_refused(setup):
    models, prompts = setup
    with pytest.raises(ValueError, match="cannot draft ahead"):
        guess_study(models.decoder("fastmtp"), prompts, 8)


def test_the_job_writes_each_drafting_ahead_method(tmp_path, capsys):
    main(["--set", "decoding.max_new_tokens=12", "--prompts", "2", "--out", str(tmp_path)])
    found = json.loads((tmp_path / "ahead_study.json").read_text())
    assert list(found["methods"]) == ["peftbd"] and found["prompts"] == 2
    assert found["methods"]["peftbd"]["rounds"] > 0
    assert "the guessed accepted length was right in" in capsys.readouterr().out
