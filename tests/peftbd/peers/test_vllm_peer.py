"""vLLM beside our engine on the tiny world (float32, greedy; needs vLLM: `bash scripts/install.sh
--with-vllm`, which CI runs; skipped with the reason where it is absent): its outputs equal our
engine's token for token, its `ngram` proposer and our prompt lookup with vLLM's occurrence rule
agree on every output and on the tokens per verifier step, and the benchmark's reference check
runs it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peftbd.benchmarking.peer_runs import tokens_per_step, vllm_tokens_per_step
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.references import reference_checks
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.config import EMBEDDED_TINY
from peftbd.decoding import SpeculativeDecoder, compare
from peftbd.methods.prompt_lookup import PromptLookupDrafter
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier, model_dirs
from peftbd.peers.vllm_client import VllmError, VllmPeer
from peftbd.peers.vllm_env import absent_reason
from peftbd.peers.vllm_protocol import Generate, Load, NgramSpec

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(absent_reason() is not None, reason=str(absent_reason())),
]
N_PROMPTS, TOKENS = 6, 48
NGRAM = NgramSpec(num_tokens=4, min_ngram=2, max_ngram=3)


@pytest.fixture(scope="module")
def world(tiny_cfg):
    """(verifier, eos ids, prompts, model dir) of the tiny world."""
    tok = load_tokenizer(tiny_cfg)
    verifier = load_verifier(tiny_cfg, torch.device("cpu"))
    prompts = first_prompts(tok, resolve_source(tiny_cfg, EMBEDDED_TINY), N_PROMPTS,
                            tiny_cfg.data.max_prompt_len)
    return verifier, eos_token_ids(verifier, tok), prompts, model_dirs(tiny_cfg)[1]


@pytest.fixture(scope="module")
def peers(world, tmp_path_factory):
    """Two side processes: plain greedy (up to 4 at once) and ngram (one at a time)."""
    _, _, prompts, model_dir = world
    logs = tmp_path_factory.mktemp("vllm")
    common = dict(model_dir=model_dir, max_model_len=max(map(len, prompts)) + TOKENS,
                  enforce_eager=True)
    with VllmPeer(logs / "ar.log") as ar, VllmPeer(logs / "ngram.log") as ngram:
        ar.load(Load(max_num_seqs=4, **common))
        ngram.load(Load(max_num_seqs=1, ngram=NGRAM, **common))
        yield ar, ngram


def test_vllm_greedy_equals_our_engine_token_for_token(world, peers):
    verifier, eos, prompts, _ = world
    ours = [r.tokens for r in SpeculativeDecoder(verifier, None, eos, TOKENS).decode_many(prompts, 4)]
    theirs = peers[0].generate(Generate(prompts=prompts, max_tokens=TOKENS, stop_token_ids=eos))
    found = [m for i, (p, a, b) in enumerate(zip(prompts, ours, theirs.outputs))
             if (m := compare(verifier, str(i), p, a, b))]
    assert all(m.top2_margin < 1e-3 for m in found), found  # a difference only at a near tie
    assert len(found) <= 1, found
    assert theirs.steps < theirs.request_steps  # 4 at once: steps shared between requests


def test_ngram_and_our_prompt_lookup_draft_alike(world, peers):
    verifier, eos, prompts, _ = world
    drafter = PromptLookupDrafter(NGRAM.num_tokens, NGRAM.min_ngram, NGRAM.max_ngram, "earliest")
    ours = [SpeculativeDecoder(verifier, drafter, eos, TOKENS).decode(p) for p in prompts]
    theirs = [peers[1].generate(Generate(prompts=[p], max_tokens=TOKENS, stop_token_ids=eos))
              for p in prompts]
    assert [r.tokens for r in ours] == [t.outputs[0] for t in theirs]
    assert tokens_per_step(ours) > 1.0  # the tiny world repeats itself: drafts are accepted
    assert tokens_per_step(ours) == pytest.approx(vllm_tokens_per_step(theirs, len(prompts)),
                                                   rel=0.02)


def test_a_failed_request_raises_with_the_side_s_message(peers):
    with pytest.raises(VllmError, match="vLLM side process"):
        peers[0].generate(Generate(prompts=[[10**9]], max_tokens=2))


def test_the_benchmark_reference_check_runs_vllm(tiny_cfg, world):
    verifier, eos, prompts, _ = world
    cfg = dataclasses.replace(tiny_cfg, decoding=dataclasses.replace(
        tiny_cfg.decoding, reference_prompts=2, reference_engines=("hf_generate", "vllm")))
    ours = [SpeculativeDecoder(verifier, None, eos, 16).decode(p).tokens for p in prompts[:2]]
    checks = reference_checks(cfg, verifier, eos, 0, [Prompt(str(i), p) for i, p in enumerate(prompts[:2])],
                              ours, 16)
    assert [(c.engine, c.checked, c.absent) for c in checks] == [("hf_generate", 2, None), ("vllm", 2, None)]
    assert checks[1].version and checks[0].identical == 2


def test_a_vllm_engine_on_another_device_than_ours_is_refused_naming_both():
    """A GPU node's `vllm` build takes the GPU while our engine runs on the CPU: the row would
    compare devices, so the peer refuses it rather than label it cpu."""
    from peftbd.benchmarking.peer_runs import PeerDeviceMismatch, same_device

    assert same_device("cpu") == "cpu"
    with pytest.raises(PeerDeviceMismatch, match="vLLM's engine loaded on cuda while ours runs on cpu"):
        same_device("cuda")
