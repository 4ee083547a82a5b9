"""Like for like: each decoder says which path every forward of its round runs on, and the
benchmark refuses, in one line, to time arms whose forwards run on different paths."""

from __future__ import annotations

import pytest
import torch

from peftbd.benchmarking.forward_paths import MixedPaths, check_like_for_like, path_words
from peftbd.decoding import BDHeadDrafter, PeftBDDrafter, SpeculativeDecoder
from peftbd.decoding.controlled import ControlledDrafter
from peftbd.errors import UserError
from peftbd.methods.prompt_lookup import PromptLookupDrafter
from peftbd.models.bd_head import BDHead, HeadShape
from peftbd.models.loading import load_tokenizer, load_verifier
from peftbd.models.peft_bd import attach_drafter_adapter


@pytest.fixture(scope="module")
def arms(tiny_cfg):
    torch.manual_seed(0)
    mask = load_tokenizer(tiny_cfg).mask_token_id
    model = attach_drafter_adapter(load_verifier(tiny_cfg), tiny_cfg.peftbd, mask)
    head = BDHead(model, HeadShape.of(tiny_cfg.peftbd_head, model.config, mask))
    return model, {"ar": None, "peftbd": PeftBDDrafter(model, mask, 8),
                   "peftbd_head": BDHeadDrafter(head, model, 8),
                   "prompt_lookup": PromptLookupDrafter(4, 1, 3)}


def _paths(arms, fast: bool) -> dict[str, dict[str, str]]:
    model, drafters = arms
    return {arm: SpeculativeDecoder(model, d, (), 8, fast_path=fast).forward_paths()
            for arm, d in drafters.items()}


def test_eager_decoders_run_every_forward_eager_and_pass(arms):
    paths = _paths(arms, fast=False)
    assert paths == {"ar": {"verify": "eager"}, "peftbd": {"verify": "eager", "draft": "eager"},
                     "peftbd_head": {"verify": "eager", "draft": "eager"},
                     "prompt_lookup": {"verify": "eager"}}  # model-free: no draft forward
    check_like_for_like(paths)
    assert path_words(paths) == "every forward eager"


class EagerPlugin(PeftBDDrafter):
    """A plugin drafter that runs its own forwards, not through `state.path`."""

    draft_on_path = False


def test_the_fast_path_compiles_every_forward_of_every_built_in_arm(arms):
    paths = _paths(arms, fast=True)
    assert paths["ar"] == paths["prompt_lookup"] == {"verify": "compiled"}
    assert paths["peftbd"] == paths["peftbd_head"] == {"verify": "compiled", "draft": "compiled"}
    check_like_for_like(paths)
    assert path_words(paths) == "every forward compiled"


def test_the_benchmark_refuses_a_draft_that_would_run_eager_beside_compiled_ar(arms):
    model, drafters = arms
    plugin = EagerPlugin(model, drafters["peftbd"].mask_id, 8)
    paths = _paths(arms, fast=True) | {
        "plugin": SpeculativeDecoder(model, plugin, (), 8, fast_path=True).forward_paths()}
    assert paths["plugin"] == {"verify": "compiled", "draft": "eager"}
    with pytest.raises(MixedPaths, match="ar's step runs compiled but plugin's draft runs eager") as err:
        check_like_for_like(paths)
    assert isinstance(err.value, UserError) and "\n" not in str(err.value)
    assert "draft_on_path" in str(err.value) and "decoding.fast_path=false" in str(err.value)
    check_like_for_like({a: paths[a] for a in ("ar", "prompt_lookup")})  # the same path: fine


def test_a_controlled_drafter_runs_the_forwards_of_the_drafter_it_wraps(arms):
    _, drafters = arms
    profile = type("P", (), {"describe": "2/round"})()
    for name in ("peftbd", "prompt_lookup"):
        controlled = ControlledDrafter(drafters[name], profile, oracle={})
        assert controlled.draft_forward == controlled.draft_on_path == (name == "peftbd")
