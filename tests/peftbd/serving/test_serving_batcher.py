"""The colocated step loop without Ray: concurrent requests are decoded as batches (a step
carries more than one request) and every request gets exactly its own batch-1 greedy output,
for every method, mixed methods, resumed requests and requests that leave early."""

from __future__ import annotations

import asyncio

import pytest

from peftbd.data.chat import encode_prompt
from peftbd.decoding import decode
from peftbd.methods import serving_names
from peftbd.serving.replica import ReplicaDecoder

MAX_NEW = 12
QUESTIONS = ["Describe the for statement.", "Count from 9 to 15.", "What is a list?",
             "Explain recursion in one sentence, with an example of a function."]


@pytest.fixture(scope="module")
def models(tiny_cfg):
    from peftbd.serving.models import load_serving_models

    return load_serving_models(tiny_cfg)


@pytest.fixture(scope="module")
def prompts(tiny_cfg):
    from peftbd.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_cfg)
    return [encode_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def references(models, prompts):
    """Each prompt's batch-1 greedy output (AR; every method must reproduce it)."""
    return [decode(models.model, p, None, MAX_NEW, models.eos_ids).tokens for p in prompts]


def _concurrent(replica: ReplicaDecoder, jobs: list[tuple[list[int], str, list[int]]]) -> list:
    """Run (prompt, method, committed) requests concurrently through `arounds`; their events."""
    async def one(prompt, method, committed):
        return [e async for e in replica.arounds(prompt, MAX_NEW, method, committed)]

    async def run():
        return await asyncio.gather(*(one(*job) for job in jobs))

    return asyncio.run(run())


def _tokens(events) -> list[int]:
    return [t for e in events for t in e.tokens]


@pytest.mark.parametrize("method", serving_names())
def test_concurrent_requests_are_batched_and_exact(models, prompts, references, method):
    replica = ReplicaDecoder(models, 16, max_batch=16, batch_wait_ms=20)
    jobs = [(p, method, []) for p in prompts * 2]  # 8 requests, prompts of different lengths
    results = _concurrent(replica, jobs)
    assert [_tokens(r) for r in results] == references * 2
    assert max(replica.batch_sizes) > 1  # a round stepped more than one request
    assert max(e.batch_size for r in results for e in r) > 1
    assert replica.streams == 0 and replica.counters["prefills"] == 8


def test_mixed_methods_keep_one_batch_each_and_stay_exact(models, prompts, references):
    replica = ReplicaDecoder(models, 16, max_batch=3, batch_wait_ms=20)
    jobs = [(p, m, []) for m in serving_names() for p in prompts]
    results = _concurrent(replica, jobs)
    assert [_tokens(r) for r in results] == references * len(serving_names())
    assert max(replica.batch_sizes) == 3  # capped at serving.max_batch, per method
    assert all(e.batch_size <= 3 for r in results for e in r)


def test_resumed_requests_join_the_batch_exactly(models, prompts, references):
    """Requests whose replica died come back with their committed tokens (one batched rebuild)
    next to fresh ones; every output is still exact."""
    replica = ReplicaDecoder(models, 16, batch_wait_ms=20)
    jobs = [(p, "peftbd_head", list(p) + ref[:4]) for p, ref in zip(prompts, references)]
    jobs += [(p, "peftbd_head", []) for p in prompts]
    results = _concurrent(replica, jobs)
    for (prompt, _, committed), events, ref in zip(jobs, results, references * 2):
        done = committed[len(prompt):]
        assert done + _tokens(events) == ref
        assert events[0].resumes == (1 if done else 0)
    assert replica.counters["resumes"] == 4 and max(replica.batch_sizes) > 1


def test_a_closed_request_leaves_its_batch(models, prompts, references):
    replica = ReplicaDecoder(models, 16, batch_wait_ms=20)

    async def run():
        leaving = replica.arounds(prompts[0], MAX_NEW, "fastmtp")
        staying = [e async for e in _after_two(leaving)]
        return staying

    async def _after_two(leaving):
        await anext(leaving), await anext(leaving)
        assert replica.streams == 1
        await leaving.aclose()  # the client left
        assert replica.streams == 0
        async for e in replica.arounds(prompts[1], MAX_NEW, "fastmtp"):
            yield e

    assert _tokens(asyncio.run(run())) == references[1]


def test_sync_rounds_from_threads_are_batched(models, prompts, references):
    from concurrent.futures import ThreadPoolExecutor

    replica = ReplicaDecoder(models, 16, batch_wait_ms=20)
    with ThreadPoolExecutor(len(prompts)) as pool:
        outs = list(pool.map(lambda p: _tokens(replica.rounds(p, MAX_NEW, "peftbd")), prompts))
    assert outs == references and max(replica.batch_sizes) > 1


def test_an_unknown_method_fails_in_the_caller(models, prompts):
    with pytest.raises(ValueError, match="not loaded"):
        next(ReplicaDecoder(models, 4).rounds(prompts[0], MAX_NEW, "nope"))
