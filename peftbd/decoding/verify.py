"""The verifier side of a round: prefill, the verify-and-accept step, and catching a state up.

All three run the verifier (adapter OFF) over the tokens not yet in the cache, with explicit
positions, and keep the cache invariant of `DecodeState`: after each call the cache holds the
verifier KV of every committed token but the last. `advance_shipped` is the exception a split
drafter uses when the verifier's process ships what it reads: it commits without a forward. The token
the verifier picks at a slot is its argmax for a greedy request and the lossless sampling rule
(`peftbd.decoding.sampling`) for a sampled one (`choose`), rows of both in one batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from peft import PeftModel
from transformers import PreTrainedModel

from peftbd.decoding.cache_adapter import CacheAdapter
from peftbd.decoding.clock import Clock, ForwardLog
from peftbd.decoding.drafter import Drafter, catch_up_layers
from peftbd.decoding.fast_path import EAGER, Chunk, ForwardPath, backbone_masks
from peftbd.decoding.packed import PREFILL_CHUNK, packed_chunks, packed_forward
from peftbd.decoding.ragged import RaggedKV, RowCache, pack
from peftbd.decoding.row_batch import padded_ids, row_entries
from peftbd.decoding.sampling import GREEDY, SamplingParams, lossless_tokens
from peftbd.decoding.state import DecodeState, timed
from peftbd.models.early_exit import first_layers


Pick = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor | None], torch.Tensor]
"""(lm_head, final hidden states, the fast path's argmax tokens or None) -> the verifier's token
at every slot (`choose`)."""


@dataclass(frozen=True)
class VerifyResult:
    """What one verify step committed: `tokens` = accepted draft prefix + bonus (cut at EOS or
    the token budget), `accepted` = the draft tokens among `tokens` (bonus excluded; a draft
    that matches the verifier past the EOS or the budget that cut it counts only up to the cut,
    EOS included), `proposed` = k."""

    proposed: int
    accepted: int
    tokens: list[int]
    done: bool


def unwrap(model: torch.nn.Module) -> PreTrainedModel:
    """The `*ForCausalLM` under a PeftModel (adapter layers stay in place), or the model itself."""
    return model.get_base_model() if isinstance(model, PeftModel) else model


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's parameters."""
    return next(model.parameters()).device


def _verifier_call(mask: torch.Tensor | None, cache: CacheAdapter, base: PreTrainedModel,
                   ids: torch.Tensor, positions: torch.Tensor, layers: tuple[int, ...],
                   argmax: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One verifier forward (a `peftbd.decoding.fast_path.Call`): the final hidden states
    (B, Q, d), the `layers` features (or None) and, `argmax`, the greedy token of every slot."""
    out = base.model(input_ids=ids, cache=cache, position_ids=positions,
                     attention_mask=backbone_masks(mask),
                     use_cache=True, output_hidden_states=bool(layers))
    hidden = out.last_hidden_state
    features = torch.cat([out.hidden_states[k] for k in layers], -1) if layers else None
    return hidden, features, base.lm_head(hidden).argmax(-1) if argmax else None


def _forward(model: torch.nn.Module, states: Sequence[DecodeState], inputs: Sequence[Sequence[int]],
             mode: str, pick: Pick | None = None
             ) -> tuple[RaggedKV, torch.Tensor, torch.Tensor | None, list[Any]]:
    """One verifier forward over each row's `inputs` at its next positions, the rows' caches
    packed (`peftbd.decoding.ragged`), on the rows' path (`state.path`): (their `RaggedKV`, the
    final hidden states (B, Q, d) and `feature_layers` features (or None) of every slot, row
    i's being its first len(inputs[i]); `pick`'s tokens per row (`tolist`: an int or a list), []
    without it). A compiled verify computes every slot's argmax in its graph, which `pick` is
    given. The caller `commit`s what the rows keep."""
    base = unwrap(model)
    device, path = states[0].device, states[0].path
    kv = pack([s.cache for s in states])
    ids, valid = padded_ids(inputs)
    positions, _ = padded_ids([range(n, n + len(x)) for n, x in zip(kv.lengths, inputs)])
    chunk = Chunk(ids.shape[1], base.config.num_hidden_layers, base.dtype,
                  None if valid.all() else valid)
    argmax = path.compiled and mode == "verify"
    with timed(states, mode):
        hidden, features, tokens = path.run(
            _verifier_call, base.config, kv, chunk, base, ids.to(device), positions.to(device),
            states[0].feature_layers, argmax)
        picked = pick(base.lm_head, hidden, tokens).tolist() if pick else []  # one device sync
    return kv, hidden, features, picked


def choose(head: torch.nn.Module, hidden: torch.Tensor, states: Sequence[DecodeState],
           drafts: Sequence[Sequence[int]], argmax: torch.Tensor | None = None) -> torch.Tensor:
    """The verifier's token at every slot of `hidden` ((B, Q, d), or (B, d): one slot per row):
    greedy rows take the argmax (`argmax`: the fast path's, already computed), exactly the greedy
    code path; sampled rows take `lossless_tokens` against their `drafts` (no draft: a draw from p)."""
    rows = [i for i, s in enumerate(states) if not s.sampling.greedy]
    if not rows:
        return head(hidden).argmax(-1) if argmax is None else argmax
    if argmax is None:
        logits = head(hidden)
        argmax, logits = logits.argmax(-1), logits[rows]
    else:  # the fast path: only the sampled rows' logits, from its hidden states
        logits = head(hidden[rows])
    tokens = lossless_tokens(logits.reshape(len(rows), -1, logits.shape[-1]),
                             [states[i].sampling for i in rows], [drafts[i] for i in rows],
                             [len(states[i].new_tokens) for i in rows])
    index = torch.tensor(rows, device=argmax.device)
    return argmax.index_put((index,), tokens.reshape(len(rows), *argmax.shape[1:]))


def _commit(state: DecodeState, tokens: Sequence[int]) -> list[int]:
    """Append `tokens`, cut at the token budget and after the first EOS; returns what was kept."""
    kept: list[int] = []
    for tok in tokens[: state.remaining]:
        kept.append(tok)
        if tok in state.eos_ids:
            state.done = True
            break
    state.tokens.extend(kept)
    if state.remaining <= 0:
        state.done = True
    return kept


def _as_list(tokens: Sequence[int] | torch.Tensor) -> list[int]:
    return tokens.reshape(-1).tolist() if isinstance(tokens, torch.Tensor) else [int(t) for t in tokens]


@torch.inference_mode()
def prefill(model: torch.nn.Module, prompt_ids: Sequence[int], max_new_tokens: int,
            eos_ids: Sequence[int] = (), feature_layers: Sequence[int] = (),
            sampling: SamplingParams = GREEDY) -> DecodeState:
    """A new request's state: one verifier forward over the prompt commits the first token
    (its argmax, or a draw from p under `sampling`); `feature_layers`: the verifier hidden
    states every forward keeps in `state.features`."""
    return prefill_rows(model, [prompt_ids], [max_new_tokens], eos_ids, feature_layers, [sampling])[0]


@torch.inference_mode()
def prefill_rows(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                 max_new_tokens: Sequence[int], eos_ids: Sequence[int] = (),
                 feature_layers: Sequence[int] = (),
                 sampling: Sequence[SamplingParams] | None = None,
                 path: ForwardPath = EAGER, pool: RaggedKV | None = None,
                 chunk: int = PREFILL_CHUNK) -> list[DecodeState]:
    """`prefill` of several requests in one packed prefill (prompts of any lengths, no padding,
    forwards of at most `chunk` tokens: `peftbd.decoding.packed`; `sampling`: one per prompt,
    None: all greedy; `path`, `pool`: the states' forward path and KV pool, see `new_state`;
    None: a new pool for these requests)."""
    sampling = sampling or [GREEDY] * len(prompts)
    pool = pool or RaggedKV([], model_device(model))
    states = [new_state(model, p, n, eos_ids, feature_layers, s, path, pool)
              for p, n, s in zip(prompts, max_new_tokens, sampling)]
    live = [s for s in states if not s.done]
    while live:
        done = {id(s) for s in prefill_step(model, live, chunk)}
        live = [s for s in live if id(s) not in done]
    return states


@torch.inference_mode()
def prefill_step(model: torch.nn.Module, states: Sequence[DecodeState], chunk: int
                 ) -> list[DecodeState]:
    """One packed prefill forward (`peftbd.decoding.packed`) over the prompts of `states`, in
    order, from where each one's cache stands (a prompt is `state.tokens` until its first token
    commits), at most `chunk` tokens, eager (once per request), the KV written to each state's
    row of its pool and its hidden states and features appended to the state's; returns the
    states whose prompt it finished, their first token committed (its argmax, or a draw from p)."""
    base, first = unwrap(model), states[0]
    caches = [s.cache for s in states]
    pool = caches[0].kv
    for cache in caches:
        if cache.kv is not pool:
            cache.move_to(pool)
    prompts = [s.tokens for s in states]
    segments = next(packed_chunks([len(p) for p in prompts], chunk,
                                  [c.get_seq_length() for c in caches]))
    clock = first.forwards.clock
    start = clock.now()
    rows = [states[s.request] for s in segments]
    for state in rows:
        if state.cache.get_seq_length() == 0:
            state.mark = start  # its prefill starts (`prefill_s` runs from here)
    with timed(rows, "prefill"):
        step = packed_forward(prompts, caches, segments, base.dtype)
        out, feats, _ = _verifier_call(step.mask, CacheAdapter(step.store), base, step.ids,
                                       step.positions, first.feature_layers, False)
        at, done, lasts = 0, [], []
        for s in segments:
            state = states[s.request]
            state.hidden = _appended(state.hidden if s.start else None, out[:, at : at + s.tokens])
            if feats is not None:
                state.features = _appended(state.features if s.start else None,
                                           feats[:, at : at + s.tokens])
            pool.extend(state.cache.row, s.tokens)
            at += s.tokens
            if s.end == len(state.tokens):
                done.append(state)
                lasts.append(out[:, at - 1])
        firsts = (choose(base.lm_head, torch.cat(lasts), done, [[] for _ in done]).tolist()
                  if done else [])  # one device sync
    end = clock.now()
    for state, token in zip(done, firsts):
        _commit(state, [token])
        state.mark, state.prefill_s = end, end - state.mark
    return done


def _appended(held: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """`new` (1, n, ...) after `held` (1, m, ...) (None: nothing held yet)."""
    return new if held is None else torch.cat([held, new], 1)


def new_state(model: torch.nn.Module, prompt_ids: Sequence[int], max_new_tokens: int,
              eos_ids: Sequence[int] = (), feature_layers: Sequence[int] = (),
              sampling: SamplingParams = GREEDY, path: ForwardPath = EAGER,
              pool: RaggedKV | None = None) -> DecodeState:
    """A request's state before any forward: `prompt_ids` committed, an empty cache (a row of
    `pool`, its decoder's static KV pool; None: a pool of its own); a sampled request without a
    seed gets a random one (`state.sampling.seed`); `path`: where its forwards run
    (`peftbd.decoding.fast_path`: `EAGER`, or a decoder's `FastPath`)."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty; pass at least one token id (e.g. the chat-template prompt)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} is negative; pass 0 or more")
    base = unwrap(model)
    device = model_device(base)
    return DecodeState(
        tokens=list(prompt_ids), prompt_len=len(prompt_ids), max_new_tokens=max_new_tokens,
        eos_ids=frozenset(eos_ids), cache=RowCache.empty(pool or RaggedKV([], device)),
        forwards=ForwardLog(Clock(device)), device=device, done=max_new_tokens == 0,
        feature_layers=tuple(feature_layers), sampling=sampling.resolved(), path=path,
    )


def accepted_prefix(draft: Sequence[int], preds: Sequence[int]) -> int:
    """Length of the longest prefix of `draft` equal to the verifier's tokens `preds` (`choose`'s:
    a sampled row's token differs from the draft token exactly where the rule rejected it)."""
    n = 0
    for d, p in zip(draft, preds):
        if d != p:
            break
        n += 1
    return n


@torch.inference_mode()
def verify(model: torch.nn.Module, state: DecodeState,
           draft: Sequence[int] | torch.Tensor) -> VerifyResult:
    """The verify-and-accept step: one verifier forward over [last committed token, draft]
    (k + 1 positions), the verifier's token at each (`choose`: argmax, or the lossless sampling
    rule), accept the longest matching prefix plus the verifier's token after it (the bonus, or
    the replacement of the first rejected draft token), keep the cache at the committed length,
    commit into `state`."""
    return verify_rows(model, [state], [draft])[0]


@torch.inference_mode()
def verify_rows(model: torch.nn.Module, states: Sequence[DecodeState],
                drafts: Sequence[Sequence[int] | torch.Tensor]) -> list[VerifyResult]:
    """`verify` of several requests in one batched forward; each row accepts its own prefix."""
    for state in states:
        if state.done:
            raise ValueError("verify() on a finished request (state.done is True); start a new one")
    drafted = [_as_list(d) for d in drafts]
    kv, hidden, features, picked = _forward(
        model, states, [s.tokens[-1:] + d for s, d in zip(states, drafted)], "verify",
        lambda head, h, argmax: choose(head, h, states, drafted, argmax))
    results, kept_slots = [], []
    for i, (state, draft) in enumerate(zip(states, drafted)):
        preds = picked[i][: len(draft) + 1]
        accepted = accepted_prefix(draft, preds)
        kept_slots.append(accepted + 1)
        state.hidden = row_entries(hidden, i, 0, accepted + 1)
        state.features = None if features is None else row_entries(features, i, 0, accepted + 1)
        kept = _commit(state, preds[: accepted + 1])
        # count what the output holds: matches past an EOS or the budget that cut `kept` are not used
        results.append(VerifyResult(proposed=len(draft), accepted=min(accepted, len(kept)),
                                    tokens=kept, done=state.done))
    kv.commit(kept_slots)
    return results


@torch.inference_mode()
def advance(model: torch.nn.Module, state: DecodeState, new_tokens: Sequence[int],
            drafter: Drafter | None = None) -> list[int]:
    """Commit tokens that another process verified (split draft/verify serving) and catch this
    state's verifier cache and `hidden` up with one adapter-off forward; returns what was kept.

    `drafter`: catch up only what it reads (`catch_up_layers`; None: everything). An early-exit
    PEFT-BD drafter reads the first k KV layers only: deeper layers then fall behind and
    `hidden` becomes None, so such a state may draft but never verify; one that reads no verifier
    state (`catch_up_layers` 0: prompt lookup) runs no forward at all, its cache falling behind."""
    return advance_rows(model, [state], [new_tokens], drafter)[0]


@torch.inference_mode()
def advance_rows(model: torch.nn.Module, states: Sequence[DecodeState],
                 new_tokens: Sequence[Sequence[int]], drafter: Drafter | None = None) -> list[list[int]]:
    """`advance` of several requests in one batched forward."""
    for state, new in zip(states, new_tokens):
        if state.done:
            raise ValueError("advance() on a finished request (state.done is True); start a new one")
        if len(new) == 0:
            raise ValueError("advance() got no new_tokens; pass the tokens a verify step committed")
    uncached = [s.tokens[-1:] for s in states]
    kept = [_commit(s, new) for s, new in zip(states, new_tokens)]
    layers = None if drafter is None else catch_up_layers(drafter)
    if layers == 0:  # it drafts from the tokens alone
        for state in states:
            state.hidden = state.features = None
        return kept
    inputs = [u + k[:-1] for u, k in zip(uncached, kept)]
    with first_layers(unwrap(model).config, layers):
        kv, hidden, features, _ = _forward(model, states, inputs, "sync")
    kv.commit([len(x) for x in inputs])
    for i, (state, x) in enumerate(zip(states, inputs)):
        state.hidden = None if layers else row_entries(hidden, i, 0, len(x))
        state.features = None if features is None else row_entries(features, i, 0, len(x))
    return kept


@torch.inference_mode()
def advance_shipped(state: DecodeState, new_tokens: Sequence[int], *,
                    features: torch.Tensor | None = None, hidden: torch.Tensor | None = None,
                    kv: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> list[int]:
    """`advance` without a forward: commit tokens another process verified and take what that
    process's verify computed for the n positions it added to its cache, which is what this
    state's drafter reads:

    - `features` (1, n, m*d), the verifier features (the block-diffusion head's
      `feature_layers`) or `hidden` (1, n, d), its final hidden states (FastMTP's
      `reads_hidden`): `state.cache` falls behind;
    - `kv`, per layer (1, heads, n, head_dim) keys and values (PEFT-BD) of the positions
      `state.cache` lacks (the verify's n, or a prefill's whole prompt on a new state): appended,
      so a forward catch-up can follow later; `hidden` becomes None.

    Such a state may draft but never verify."""
    if state.done:
        raise ValueError("advance_shipped() on a finished request (state.done is True)")
    if len(new_tokens) == 0:
        raise ValueError("advance_shipped() got no new_tokens; pass what a verify committed")
    kept = _commit(state, new_tokens)
    if kv is not None:
        cached, needed = state.cache.get_seq_length(), len(state.tokens) - 1
        if cached + kv[0][0].shape[2] != needed:
            raise ValueError(f"the shipped KV covers {kv[0][0].shape[2]} positions and the cache "
                             f"holds {cached}: together they must be the {needed} committed "
                             f"before the last token")
        state.cache.append(kv)
    state.hidden = hidden if hidden is None else hidden.to(state.device)
    state.features = features if features is None else features.to(state.device)
    return kept
