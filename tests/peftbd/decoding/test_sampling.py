"""Lossless speculative sampling (`peftbd.decoding.sampling`): with every drafter the output's
distribution is AR sampling's, by total variation against the exact distribution on a micro Qwen3
with a 16-token vocabulary; per filter, a detector with a proven false-alarm rate and power passes
the first two tokens and rejects lossy rules; filters, seeds, mixed batches, greedy rows untouched.

The detector (`excess`). D = TV(empirical pmf of n samples, exact pmf p) over K outcomes (the first
token: K = V = 16; the first two tokens' joint: K = V^2 = 256), rejecting when D >= tau. For one
pmf p and n:
- Null (samples from p). One sample moves D by <= 1/n, so McDiarmid gives P(D >= E D + t) <=
  exp(-2 n t^2); and E D <= sum_x min(sqrt(p(x) (1 - p(x)) / n), 2 p(x)) / 2 (Jensen, and
  E|p_hat - p| <= 2 p). tau = that mean bound + sqrt(ln(1 / a) / (2 n)) rejects with probability
  <= a; both checks at a = ALPHA / 2: a false alarm <= ALPHA = 1e-6 per test.
- Alternative q with TV(p, q) = delta. D >= delta - TV(p_hat, q) (triangle); TV(p_hat, q) <=
  sum_x sqrt(q (1 - q) / n) / 2 + sqrt(ln(1 / BETA) / (2 n)) with probability >= 1 - BETA
  (McDiarmid), and sum_x sqrt(q (1 - q)) <= S_p + sum_x sqrt|q - p| <= S_p + sqrt(2 K delta)
  (|x (1 - x) - y (1 - y)| <= |x - y|; sqrt subadditive; Cauchy-Schwarz), S_p = sum_x
  sqrt(p (1 - p)). With tau <= (S_p / 2 + c_a) / sqrt(n), D > tau with probability >= 1 - BETA once
      sqrt(n) delta >= S_p + sqrt(2 K delta) / 2 + c_a + c_b,
  c_a = sqrt(ln(2 / ALPHA) / 2) = 2.69, c_b = sqrt(ln(1 / BETA) / 2) = 1.22: `sample_size`'s n,
  the larger over the two checks. The margin sqrt(n) delta - sqrt(2 K delta) / 2 grows with delta
  (n delta > K / 8), so larger errors are caught at least as often.
On WIDE at the FILTERS below (S_p of the joint 2.2-6.7, of the first token 1.0-2.8) n is 150k-374k
for delta = 0.02 (slow), 30k-69k for delta = 0.05.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from peftbd.decoding import (BDHeadDrafter, MTPDrafter, NoDrafter, PeftBDDrafter, SamplingParams,
                             SpeculativeDecoder, sampling)
from peftbd.decoding.fast_path import _static_graph
from peftbd.decoding.sampling import lossless_tokens, target_probs
from peftbd.decoding.verify import unwrap
from peftbd.models.bd_head import BDHead, HeadShape
from peftbd.models.mtp_head import MTPHead
from peftbd.models.peft_bd import attach_drafter_adapter

V, MASK, PROMPT = 16, 15, [3, 5, 7, 2]
L = 4  # tokens per sample: prefill's draw, a 2-token draft's two tests or residuals, a bonus
N = 6000  # seeded samples per distribution
T1 = SamplingParams(temperature=1.0)
FILTERED = SamplingParams(temperature=1.3, top_k=3, top_p=0.9)
WIDE = [6, 0, 4, 5]  # a prompt whose first token is uncertain (top five 0.18-0.10 at T = 1)
FILTERS = {"temperature": SamplingParams(0.5), "top-k": SamplingParams(1.0, top_k=3),
           "top-p": SamplingParams(1.0, top_p=0.5),  # 4 first tokens kept
           "top-k and top-p": SamplingParams(0.8, top_k=4, top_p=0.6)}  # each cuts the other's set
ALPHA, BETA = 1e-6, 0.05  # the detector's false-alarm rate (both checks together) and miss rate


@pytest.fixture(scope="module")
def micro(tiny_cfg):
    """A random 2-layer Qwen3 over 16 tokens (its init wide enough that a few tokens carry most
    of the mass: the joint of 4 tokens is estimable from thousands of samples) with an untrained
    PEFT-BD adapter, and every drafter family on it."""
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         max_position_embeddings=64, tie_word_embeddings=True, initializer_range=0.4,
                         pad_token_id=0, bos_token_id=None, eos_token_id=None)
    model = attach_drafter_adapter(Qwen3ForCausalLM(config).eval().requires_grad_(False),
                                   tiny_cfg.peftbd, MASK)
    head = BDHead(model, HeadShape.of(tiny_cfg.peftbd_head, model.config, MASK))
    return model, {"ar": None, "peftbd": PeftBDDrafter(model, MASK, 8),
                   "fastmtp": MTPDrafter(MTPHead(model), model, num_steps=3),
                   "peftbd_head": BDHeadDrafter(head, model, 8)}


def tails(length: int) -> list[tuple[int, ...]]:
    return list(itertools.product(range(V), repeat=length - 1))


def logits_after(model, prompt: list[int], length: int) -> torch.Tensor:
    """(V^(length-1), length, V): the verifier's logits at the first `length` output positions of
    `prompt` followed by each of `tails(length)`."""
    with torch.no_grad():
        logits = unwrap(model)(torch.tensor([prompt + list(t) for t in tails(length)])).logits
    return logits[:, len(prompt) - 1 :]


def exact(model, params: SamplingParams, prompt: list[int] = PROMPT,
          length: int = L) -> tuple[torch.Tensor, dict[tuple[int, ...], torch.Tensor]]:
    """AR sampling's exact distribution of `prompt`'s first `length` tokens: the joint (V^length,)
    (index t_1 V^(length-1) + ... + t_length) and each prefix's next-token p."""
    rows = tails(length)
    probs = target_probs(logits_after(model, prompt, length), [params] * len(rows)).double()
    taken = probs[:, :-1].gather(-1, torch.tensor(rows).view(len(rows), -1, 1)).squeeze(-1).prod(-1)
    nexts = {tail[:j]: probs[i, j] for i, tail in enumerate(rows) for j in range(length)}
    return (taken.unsqueeze(-1) * probs[:, -1]).reshape(-1), nexts


def sample(model, drafter, params: SamplingParams, n: int = N) -> tuple[torch.Tensor, list]:
    """The empirical joint of n seeded samples, all rows of one `decode_many`; and the results."""
    decoder = SpeculativeDecoder(model, drafter, (), L)
    results = decoder.decode_many([PROMPT] * n, n, L, [dataclasses.replace(params, seed=s) for s in range(n)])
    index = torch.tensor([sum(t * V ** (L - 1 - j) for j, t in enumerate(r.tokens)) for r in results])
    return torch.bincount(index, minlength=V**L).double() / n, results


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * (p - q).abs().sum().item()


def threshold(p: torch.Tensor, n: int, alpha: float = ALPHA) -> float:
    """tau: TV(empirical of n samples of p, p) exceeds it with probability <= alpha (module doc)."""
    mean = torch.minimum((p * (1 - p) / n).sqrt(), 2 * p).sum().item() / 2
    return mean + math.sqrt(math.log(1 / alpha) / (2 * n))


def first_of(joint: torch.Tensor) -> torch.Tensor:
    return joint.view(V, V).sum(1)


def excess(tokens: torch.Tensor, joint: torch.Tensor) -> list[float]:
    """TV minus tau for n sampled first two tokens (n, 2) against the exact `joint` (V^2,): the
    first token's check, then the pair's, each at ALPHA / 2; the detector rejects if either >= 0."""
    checks = ((first_of(joint), tokens[:, 0]), (joint, tokens[:, 0] * V + tokens[:, 1]))
    return [tv(torch.bincount(index, minlength=len(p)).double() / len(tokens), p)
            - threshold(p, len(tokens), ALPHA / 2) for p, index in checks]


def sample_size(joint: torch.Tensor, delta: float) -> int:
    """The n at which `excess` catches a TV error >= delta in the first token's or the pair's
    distribution with probability >= 1 - BETA (module doc)."""
    def one(p: torch.Tensor) -> int:
        slack = (math.sqrt(2 * len(p) * delta) / 2 + math.sqrt(math.log(2 / ALPHA) / 2)
                 + math.sqrt(math.log(1 / BETA) / 2))
        return math.ceil((((p * (1 - p)).sqrt().sum().item() + slack) / delta) ** 2)

    return max(one(first_of(joint)), one(joint))


def two_tokens(model, params: SamplingParams, n: int) -> torch.Tensor:
    """n seeded samples (n, 2) of WIDE's first two tokens, drawn by `lossless_tokens` as the
    decoder calls it with a drafter proposing p's argmax: prefill's draw (no draft, output index
    0), then the draft tested at index 1, a residual draw where rejected (row by row the decoder's
    tokens: `test_the_two_token_sampler_is_the_decoders`), without the decoder's per-row cost."""
    logits = logits_after(model, WIDE, 2)  # row t: after WIDE, after WIDE + [t]
    rows = [dataclasses.replace(params, seed=s) for s in range(n)]
    first = lossless_tokens(logits[:1, :1].expand(n, 1, V), rows, [[]] * n, [0] * n)[:, 0]
    drafts = target_probs(logits[:, 1:], [params] * V)[:, 0].argmax(-1)[first].view(n, 1)
    second = lossless_tokens(logits[first, 1:], rows, drafts.tolist(), [1] * n)[:, 0]
    return torch.stack([first, second], 1)


class HighLow(NoDrafter):
    """Proposes the most likely next token, then the least likely after it (exact p): both
    branches of the rule at each draft position; under top-k the second is a filtered token."""

    name = "high-low"

    def __init__(self, nexts: dict[tuple[int, ...], torch.Tensor]) -> None:
        self.nexts = nexts

    def propose(self, states, max_tokens):
        drafts = []
        for state, m in zip(states, max_tokens):
            draft: list[int] = []
            for j in range(m):
                p = self.nexts[tuple(state.new_tokens) + tuple(draft)]
                draft.append(int(p.argmax() if j % 2 == 0 else p.argmin()))
            drafts.append(torch.tensor([draft], dtype=torch.long))
        return drafts


@pytest.mark.parametrize("name,params", [("ar", T1), ("high-low", T1), ("peftbd", T1), ("fastmtp", T1),
                                         ("peftbd_head", T1), ("high-low", FILTERED), ("fastmtp", FILTERED)])
def test_speculative_sampling_is_ar_sampling(micro, name, params):
    model, drafters = micro
    want, nexts = exact(model, params)
    drafter = HighLow(nexts) if name == "high-low" else drafters[name]
    got, results = sample(model, drafter, params)
    assert tv(got, want) < threshold(want, N), (name, tv(got, want), threshold(want, N))
    assert want[got > 0].min() > 0  # never a filtered token
    rounds = [r for res in results for r in res.rounds]
    if drafter is not None:  # both branches of the rule ran
        assert 0 < sum(r.accepted for r in rounds) < sum(r.proposed for r in rounds)


@pytest.mark.parametrize("name,delta", [pytest.param(name, delta, id=f"{name}-tv{delta}",
                                                      marks=[pytest.mark.slow] if delta < 0.05 else [])
                                         for name in FILTERS for delta in (0.02, 0.05)])
def test_two_tokens_are_ar_sampling(micro, name, delta):
    """The detector (module doc) at the n that catches a TV error >= delta with probability
    >= 0.95 passes the first two tokens under each filter (0.02: slow; 0.05: the quick loop)."""
    model, _ = micro
    joint, _ = exact(model, FILTERS[name], WIDE, 2)
    n = sample_size(joint, delta)
    found = excess(two_tokens(model, FILTERS[name], n), joint)
    assert max(found) < 0, (name, n, found)


@pytest.mark.parametrize("name", FILTERS)
def test_the_two_token_sampler_is_the_decoders(micro, name):
    """`two_tokens` draws the decoder's tokens row by row: its statistics are the decoder's."""
    model, _ = micro
    n, params = 1000, FILTERS[name]
    _, nexts = exact(model, params, WIDE, 2)
    decoder = SpeculativeDecoder(model, HighLow(nexts), (), 3)  # 3 tokens: one drafted, a bonus
    results = decoder.decode_many([WIDE] * n, n, 3, [dataclasses.replace(params, seed=s) for s in range(n)])
    assert [r.tokens[:2] for r in results] == two_tokens(model, params, n).tolist()
    assert 0 < sum(r.rounds[0].accepted for r in results) < n  # both branches of the rule ran


class _UnscaledDraw:
    """`torch` for `sampling` but for its residual draw, which inverts the residual's cdf at the
    uniform itself, not at the uniform times the residual's mass: the residual is not
    renormalised (a uniform past its mass falls to the clamp's token)."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def searchsorted(cdf: torch.Tensor, values: torch.Tensor, **kwargs) -> torch.Tensor:
        return torch.searchsorted(cdf, values / cdf[..., -1:], **kwargs)


def _accept_every_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "accepts", lambda u, p: torch.ones_like(u, dtype=torch.bool))


def _shared_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trap issue 36 cites (vLLM #54282): the residual draw reuses the test's uniform."""
    uniforms = sampling.uniforms
    monkeypatch.setattr(sampling, "uniforms", lambda seeds, index, stream: uniforms(seeds, index, 0))


def _unnormalised_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sampling, "torch", _UnscaledDraw())


LOSSY = {"accept every draft token": _accept_every_draft, "shared stream": _shared_stream,
         "unnormalised residual": _unnormalised_residual}


@pytest.mark.parametrize("name,lossy", [
    pytest.param(name, lossy, marks=[] if name == "top-k and top-p" else [pytest.mark.slow])
    for name in FILTERS for lossy in LOSSY])
def test_a_lossy_rule_is_caught(micro, monkeypatch, name, lossy):
    """Each lossy rule's exact TV on the pair is >= 0.069 under every filter (accepting every
    draft 0.40-0.64, a shared stream 0.10-0.18, an unnormalised residual 0.069-0.14; the first
    token is untouched), so the detector at delta = 0.05 catches it with probability >= 0.95."""
    model, _ = micro
    joint, _ = exact(model, FILTERS[name], WIDE, 2)
    n = sample_size(joint, 0.05)
    LOSSY[lossy](monkeypatch)
    assert max(excess(two_tokens(model, FILTERS[name], n), joint)) >= 0, (name, lossy, n)


def test_the_fast_path_samples_as_the_eager_forward(micro):
    model, drafters = micro
    params = [SamplingParams(temperature=1.0, seed=s) for s in range(5)] + [SamplingParams()]
    for name in ("ar", "fastmtp"):
        eager = SpeculativeDecoder(model, drafters[name], (), 12)
        fast = SpeculativeDecoder(model, drafters[name], (), 12, fast_path=True)
        fast.path._graph = _static_graph  # the graph uncompiled: the fast branch without compiling
        want = [r.tokens for r in eager.decode_many([PROMPT] * 6, 6, 12, params)]
        assert [r.tokens for r in fast.decode_many([PROMPT] * 6, 6, 12, params)] == want, name


def test_draws_depend_only_on_seed_index_and_stream_and_are_uniform():
    index = np.arange(6).reshape(2, 3) + 10
    both = sampling.uniforms([5, 2**70 + 9], index, 0)
    assert (both[:1] == sampling.uniforms([5], index[:1], 0)).all()  # whatever the batch
    assert (both[1:] == sampling.uniforms([2**70 + 9], index[1:], 0)).all()
    assert not np.isin(both, sampling.uniforms([5, 2**70 + 9], index, 1)).any()  # streams differ
    many = sampling.uniforms(range(400), np.arange(250)[None].repeat(400, 0), 0).ravel()
    assert 0 <= many.min() and many.max() < 1
    counts = np.bincount((many * 20).astype(int), minlength=20)  # chi-square, 19 dof: p ~ 1e-6
    assert ((counts - len(many) / 20) ** 2 / (len(many) / 20)).sum() < 60, counts


def test_the_rule_never_keeps_a_filtered_draft_and_always_a_certain_one():
    """The rule's sure cases (its statistics: `test_two_tokens_are_ar_sampling`)."""
    n = 200
    logits = torch.tensor([0.0, 1.0, 2.0, 3.0]).expand(n, 2, 4)  # top-k 2: p = (0, 0, .27, .73)
    top2 = [SamplingParams(temperature=1.0, top_k=2, seed=s) for s in range(n)]
    filtered = lossless_tokens(logits, top2, [[0]] * n, [0] * n)
    assert set(filtered[:, 0].tolist()) == {2, 3}  # a zero-probability draft token: never accepted
    likely = lossless_tokens(logits, top2, [[3]] * n, [0] * n)
    assert set(likely[:, 0].tolist()) == {2, 3}  # rejected: the residual is token 2
    top1 = [dataclasses.replace(p, top_k=1) for p in top2]
    assert (lossless_tokens(logits, top1, [[3]] * n, [0] * n)[:, 0] == 3).all()  # p(x) = 1: always


def test_filters_follow_vllm():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0]]])  # softmax (.03, .09, .24, .64)

    def kept(**kw) -> list[bool]:
        return (target_probs(logits, [SamplingParams(temperature=1.0, **kw)])[0, 0] > 0).tolist()

    assert kept(top_k=2) == kept(top_p=0.7) == kept(top_k=3, top_p=0.7) == [False, False, True, True]
    assert kept(top_p=0.6) == kept(top_k=1) == [False, False, False, True]
    assert kept(top_p=0.95) == [False, True, True, True] and kept(top_k=4) == kept() == [True] * 4
    hot = target_probs(logits, [SamplingParams(temperature=2.0)])[0, 0]
    assert torch.allclose(hot, (logits[0, 0] / 2).softmax(-1))
    both = target_probs(logits.expand(2, 1, 4), [SamplingParams(temperature=2.0), SamplingParams(1.0, top_k=2)])
    assert torch.equal(both[0], hot.view(1, 4)) and (both[1, 0] > 0).tolist() == kept(top_k=2)


@pytest.mark.parametrize("kwargs,match", [({"temperature": -0.5}, "temperature"),
                                          ({"temperature": "0.7"}, "temperature"),
                                          ({"temperature": math.nan}, "temperature"),
                                          ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
                                          ({"top_k": -1}, "top_k"), ({"top_k": 2.5}, "top_k"),
                                          ({"seed": "7"}, "seed")])
def test_bad_parameters_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


MIXED = [SamplingParams(), SamplingParams(temperature=1.0, seed=1), SamplingParams(0.7, top_k=5, seed=2),
         SamplingParams(), SamplingParams(1.2, top_p=0.8, seed=3), SamplingParams(1.0, seed=4)]


@pytest.fixture(scope="module")
def perturbed(perturbed_drafter, tokenizer, open_prompts):
    """The tiny verifier with a noisy PEFT-BD adapter (it drafts wrong tokens too), and six rows
    of questions it was never taught (on taught ones it samples its greedy reply)."""
    model = perturbed_drafter()
    return model, PeftBDDrafter(model, tokenizer.mask_token_id, 8), open_prompts * 2


def test_rows_with_different_parameters_decode_as_they_do_alone(perturbed, eos):
    model, drafter, rows = perturbed
    decoder = SpeculativeDecoder(model, drafter, eos, 24)
    alone = [decoder.decode(p, 24, s).tokens for p, s in zip(rows, MIXED)]
    for batch_size in (6, 4):  # 4: rows join as others finish
        assert [r.tokens for r in decoder.decode_many(rows, batch_size, 24, MIXED)] == alone
    greedy = [SpeculativeDecoder(model, None, eos, 24).decode(p).tokens for p in rows]
    assert all((a == g) == s.greedy for a, g, s in zip(alone, greedy, MIXED))  # greedy rows untouched


def test_seeds_reproduce_and_a_top_1_filter_is_greedy(perturbed, eos):
    model, drafter, rows = perturbed
    decoder = SpeculativeDecoder(model, drafter, eos, 24)
    first = decoder.decode(rows[0], 24, SamplingParams(1.0, seed=7)).tokens
    assert decoder.decode(rows[0], 24, SamplingParams(1.0, seed=7)).tokens == first
    assert any(decoder.decode(rows[0], 24, SamplingParams(1.0, seed=s)).tokens != first for s in (8, 9))
    seeds = [s.sampling.seed for s in decoder.start_many(rows[:2], 24, SamplingParams(1.0))]
    assert None not in seeds and seeds[0] != seeds[1]  # unseeded: a random seed each, on record
    greedy = decoder.decode(rows[0]).tokens
    assert SamplingParams(1e-6, seed=1).greedy and not SamplingParams(1e-5).greedy  # vLLM's cut
    assert decoder.decode(rows[0], 24, SamplingParams(0.8, top_k=1)).tokens == greedy
    assert decoder.decode(rows[0], 24, SamplingParams(1.5, top_p=1e-6)).tokens == greedy
    with pytest.raises(ValueError, match="sampling has 1 entries for 2 prompts"):
        decoder.start_many(rows[:2], 24, [SamplingParams(1.0)])
