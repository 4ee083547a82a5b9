"""Controlled acceptance in the Serve apps (`serving.synthetic`): the replicas' drafts run at the
chosen acceptance, colocated and split, and every answer is still greedy AR's; usage and metrics
say it is synthetic; bad entries and reference files fail at startup with the key named."""

from __future__ import annotations

import dataclasses
import statistics
import threading

import pytest

from peftbd.config import ConfigError, load_config
from peftbd.data.chat import encode_prompt
from peftbd.decoding import decode
from peftbd.decoding.controlled import GreedyOracle
from peftbd.serving.replica import ReplicaDecoder
from peftbd.serving.rounds import RequestStats
from peftbd.serving.synthetic import (
    draft_positions,
    method_label,
    read_references,
    synthetic_rates,
    write_references,
)

from .split_local import LocalCalls

MAX_NEW = 64
RATES = {"peftbd": 3.5, "fastmtp": 2.0, "peftbd_head": 4.0}


@pytest.fixture(scope="module")
def synthetic_cfg(tiny_cfg):
    entries = [f"{m}={r}" for m, r in RATES.items()]
    return dataclasses.replace(tiny_cfg, serving=dataclasses.replace(
        tiny_cfg.serving, synthetic=tuple(entries)))


@pytest.fixture(scope="module")
def models(synthetic_cfg):
    from peftbd.serving.models import load_serving_models

    return load_serving_models(synthetic_cfg)


@pytest.fixture(scope="module")
def prompts(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_cfg)
    questions = ["Describe the for statement.", "What is a tuple?", "Explain list slicing.",
                 "How do I open a file?", "What does yield do?", "Define a class.",
                 "What is a dict?", "Explain recursion.", "How do I sort a list?",
                 "What is a lambda?", "Explain exceptions.", "What is a module?"]
    return [encode_prompt(tok, [{"role": "user", "content": q}]) for q in questions]


@pytest.fixture(scope="module")
def references(models, prompts):
    return {tuple(p): decode(models.model, p, None, MAX_NEW, models.eos_ids).tokens for p in prompts}


@pytest.mark.parametrize("method", sorted(RATES))
def test_colocated_synthetic_is_exact_and_accepts_at_its_rate(synthetic_cfg, models, prompts,
                                                                references, method):
    replica, positions = ReplicaDecoder(models, 8), draft_positions(synthetic_cfg, method)
    stats, emitted = RequestStats(method, RATES[method]), []
    for p in prompts:  # a prompt's draws are fixed by the seed: repeating it adds nothing
        events = list(replica.rounds(p, MAX_NEW, method))
        assert [t for e in events for t in e.tokens] == references[tuple(p)]
        for e in events:
            stats.add(e)
        # rounds with a full draft that did not end the request: the profile decides them
        emitted += [len(e.tokens) for e in events[1:-1] if e.proposed == positions]
    summary = stats.summary()
    assert summary.synthetic == RATES[method]
    assert "synthetic" in models.decoder(method).drafter.name
    mean, se = statistics.mean(emitted), statistics.stdev(emitted) / len(emitted) ** 0.5
    assert mean == pytest.approx(RATES[method], abs=4 * se), (mean, se, len(emitted))


@pytest.mark.parametrize("method", sorted(RATES))
def test_split_synthetic_batched_is_exact(synthetic_cfg, models, prompts, references, method):
    """A split Verifier's step loop (its own verifier, as deployed) batches every request, its
    Drafter replica drafting each round in one batched call (two groups: one verifies while the
    other drafts); the outputs are AR's and the drafts accept beyond chance."""
    from peftbd.serving.models import load_serving_models

    drafter = ReplicaDecoder(models, 8)
    verifier = ReplicaDecoder(load_serving_models(synthetic_cfg, ("ar",)), 8, 8, 50.0,
                              drafters=LocalCalls(drafter), groups=2)
    outputs: dict[int, list] = {}

    def run(i: int) -> None:
        outputs[i] = list(verifier.rounds(prompts[i], MAX_NEW, method))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, p in enumerate(prompts):
        assert [t for e in outputs[i] for t in e.tokens] == references[tuple(p)]
    assert sum(e.accepted for events in outputs.values() for e in events) \
        > len(prompts) * MAX_NEW / 3  # an untrained drafter alone accepts ~nothing
    assert max(drafter.batch_sizes) > 1 and max(verifier.batch_sizes) > 1


def test_the_oracle_decodes_unknown_prompts_once_and_uses_references(models, prompts, references):
    calls = []

    def ar(prompt, n):
        calls.append(n)
        return decode(models.model, prompt, None, n, models.eos_ids).tokens

    oracle = GreedyOracle(ar, MAX_NEW, {tuple(prompts[0]): references[tuple(prompts[0])]})
    from peftbd.decoding.verify import new_state

    known = new_state(models.model, prompts[0], MAX_NEW, models.eos_ids)
    assert list(oracle(known)) == references[tuple(prompts[0])] and not calls
    fresh = new_state(models.model, prompts[1], MAX_NEW, models.eos_ids)
    assert list(oracle(fresh)) == references[tuple(prompts[1])] and calls == [MAX_NEW]
    oracle(fresh)
    assert oracle.misses == 1 and oracle.miss_s > 0  # kept after the first decode
    longer = new_state(models.model, prompts[1], 2 * MAX_NEW, models.eos_ids)
    out = oracle(longer)  # a larger budget than the kept output: decoded again, longer
    assert calls[-1] == 2 * MAX_NEW and list(out[:MAX_NEW]) == references[tuple(prompts[1])]


def test_usage_and_metrics_name_the_synthetic_rate(tiny_cfg):
    cfg = dataclasses.replace(tiny_cfg, serving=dataclasses.replace(
        tiny_cfg.serving, synthetic=("peftbd=2.881",)))
    rates = synthetic_rates(cfg)
    assert rates == {"peftbd": 2.881}
    assert method_label("peftbd", rates) == "peftbd [synthetic: 2.881/round]"
    assert method_label("fastmtp", rates) == "fastmtp"
    assert RequestStats("fastmtp").summary().synthetic is None


@pytest.mark.parametrize("entries,needle", [
    (("ar=2",), "names no drafting method"),
    (("peft-bd=2",), r"names no drafting method \('peft-bd' was renamed to 'peftbd'\)"),
    (("peftbd=2", "peftbd=3"), "named twice"),
    (("fastmtp=9",), "draft positions"),
])
def test_bad_synthetic_entries_name_the_key(tiny_cfg, entries, needle):
    cfg = dataclasses.replace(tiny_cfg, serving=dataclasses.replace(tiny_cfg.serving,
                                                                    synthetic=entries))
    with pytest.raises(ConfigError, match=needle) as err:
        synthetic_rates(cfg)
    assert "serving.synthetic" in str(err.value)


def test_the_config_refuses_entries_of_another_form():
    with pytest.raises(ConfigError, match="serving.synthetic"):
        load_config("tiny", None, ["serving.synthetic=[peftbd]"])


def test_references_round_trip_and_bad_files_are_config_errors(tmp_path):
    refs = {(1, 2, 3): [4, 5], (6,): [7]}
    write_references(tmp_path / "r.json", refs)
    assert read_references(tmp_path / "r.json") == refs
    (tmp_path / "bad.json").write_text('{"outputs": []}')
    with pytest.raises(ConfigError, match="bad.json"):
        read_references(tmp_path / "bad.json")
