"""The verifier side of a round: prefill, the verify-and-accept step, and catching a state up.

All three run the verifier (adapter OFF) over the tokens not yet in the cache, with explicit
positions, and keep the cache invariant of `DecodeState`: after each call the cache holds the
verifier KV of every committed token but the last. `advance_with_features` is the exception a
split drafter that reads only verifier features uses: it commits without a forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from peft import PeftModel
from transformers import DynamicCache, PreTrainedModel

from peftbd.decoding.clock import Clock, ForwardLog
from peftbd.decoding.state import DecodeState
from peftbd.models.early_exit import first_layers


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


def _forward(model: torch.nn.Module, state: DecodeState, input_ids: torch.Tensor, keep: int,
             mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Verifier forward over `input_ids` at the next positions; (logits of the last `keep`
    positions, final hidden states of all positions, their `state.feature_layers` features or
    None). Extends `state.cache`."""
    base = unwrap(model)
    start = state.cache.get_seq_length()
    positions = torch.arange(start, start + input_ids.shape[1], device=state.device).unsqueeze(0)
    layers = state.feature_layers
    with state.forwards.timed(mode):
        out = base.model(input_ids=input_ids, cache=state.cache, position_ids=positions,
                         use_cache=True, output_hidden_states=bool(layers))
        hidden = out.last_hidden_state
        logits = base.lm_head(hidden[:, -keep:]) if keep else hidden[:, :0]
        features = torch.cat([out.hidden_states[k] for k in layers], -1) if layers else None
    return logits, hidden, features


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


def _as_ids(tokens: Sequence[int] | torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(tokens, torch.Tensor):
        return tokens.to(device=device, dtype=torch.long).reshape(1, -1)
    return torch.tensor([list(tokens)], dtype=torch.long, device=device)


@torch.inference_mode()
def prefill(model: torch.nn.Module, prompt_ids: Sequence[int], max_new_tokens: int,
            eos_ids: Sequence[int] = (), feature_layers: Sequence[int] = ()) -> DecodeState:
    """A new request's state: one verifier forward over the prompt commits the first token;
    `feature_layers`: the verifier hidden states every forward keeps in `state.features`."""
    state = new_state(model, prompt_ids, max_new_tokens, eos_ids, feature_layers)
    if state.done:
        return state
    clock = state.forwards.clock
    start = clock.now()
    logits, state.hidden, state.features = _forward(model, state, _as_ids(prompt_ids, state.device),
                                                    keep=1, mode="prefill")
    _commit(state, [int(logits[0, -1].argmax())])
    state.mark = clock.now()
    state.prefill_s = state.mark - start
    return state


def new_state(model: torch.nn.Module, prompt_ids: Sequence[int], max_new_tokens: int,
              eos_ids: Sequence[int] = (), feature_layers: Sequence[int] = ()) -> DecodeState:
    """A request's state before any forward: `prompt_ids` committed, an empty cache."""
    if len(prompt_ids) == 0:
        raise ValueError("prompt_ids is empty; pass at least one token id (e.g. the chat-template prompt)")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} is negative; pass 0 or more")
    base = unwrap(model)
    device = model_device(base)
    return DecodeState(
        tokens=list(prompt_ids), prompt_len=len(prompt_ids), max_new_tokens=max_new_tokens,
        eos_ids=frozenset(eos_ids), cache=DynamicCache(config=base.config),
        forwards=ForwardLog(Clock(device)), device=device, done=max_new_tokens == 0,
        feature_layers=tuple(feature_layers),
    )


def accepted_prefix(draft: Sequence[int], preds: Sequence[int]) -> int:
    """Length of the longest prefix of `draft` equal to the verifier's greedy tokens `preds`."""
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
    (k + 1 positions), greedy argmax, accept the longest matching prefix plus the bonus token,
    crop the cache back to the committed length, commit into `state`."""
    if state.done:
        raise ValueError("verify() on a finished request (state.done is True); start a new one")
    draft_ids = _as_ids(draft, state.device)
    k = draft_ids.shape[1]
    inputs = torch.cat([_as_ids(state.tokens[-1:], state.device), draft_ids], dim=1)
    logits, hidden, features = _forward(model, state, inputs, keep=k + 1, mode="verify")
    both = torch.cat([logits.argmax(-1), draft_ids], dim=1)[0].tolist()  # one device sync
    preds, drafted = both[: k + 1], both[k + 1 :]
    accepted = accepted_prefix(drafted, preds)
    state.cache.crop(-(k - accepted))
    state.hidden = hidden[:, : accepted + 1]
    state.features = None if features is None else features[:, : accepted + 1]
    kept = _commit(state, preds[: accepted + 1])
    # count what the output holds: matches past an EOS or the budget that cut `kept` are not used
    return VerifyResult(proposed=k, accepted=min(accepted, len(kept)), tokens=kept, done=state.done)


@torch.inference_mode()
def advance(model: torch.nn.Module, state: DecodeState, new_tokens: Sequence[int],
            layers: int | None = None) -> list[int]:
    """Commit tokens that another process verified (split draft/verify serving) and catch this
    state's verifier cache and `hidden` up with one adapter-off forward; returns what was kept.

    `layers` = k syncs only the first k layers (a drafter that reads no more: an early-exit
    PEFT-BD drafter's `kv_layers`); deeper layers then fall behind and `hidden` becomes None, so
    such a state may draft but never verify."""
    if state.done:
        raise ValueError("advance() on a finished request (state.done is True); start a new one")
    if len(new_tokens) == 0:
        raise ValueError("advance() got no new_tokens; pass the tokens a verify step committed")
    uncached = state.tokens[-1:]
    kept = _commit(state, new_tokens)
    uncached = uncached + kept[:-1]
    with first_layers(unwrap(model).config, layers):
        _, hidden, state.features = _forward(model, state, _as_ids(uncached, state.device),
                                             keep=0, mode="sync")
    state.hidden = None if layers else hidden
    return kept


def advance_with_features(state: DecodeState, new_tokens: Sequence[int],
                          features: torch.Tensor) -> list[int]:
    """`advance` without a forward, for a drafter that reads only `state.features`
    (`kv_layers == 0`, the block-diffusion head): commit tokens another process verified and take
    `features` (1, n, m*d), the verifier features that process computed for the n positions its
    forward added to its cache, as this round's `state.features`. `state.cache` and `hidden` fall
    behind (`hidden` becomes None): such a state may draft but never verify."""
    if state.done:
        raise ValueError("advance_with_features() on a finished request (state.done is True)")
    if len(new_tokens) == 0:
        raise ValueError("advance_with_features() got no new_tokens; pass what a verify committed")
    kept = _commit(state, new_tokens)
    state.hidden, state.features = None, features.to(state.device)
    return kept
