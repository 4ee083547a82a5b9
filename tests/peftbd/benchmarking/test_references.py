"""The audit's independent references: AR's outputs against HF generate's (always) and vLLM's
(said absent where it is not installed), merged over shards, and the report's words on them."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peftbd.analysis.references import describe
from peftbd.benchmarking.prompts import Prompt
from peftbd.benchmarking.references import ReferenceCheck, reference_checks
from peftbd.benchmarking.results import reference_rows
from peftbd.config import EMBEDDED_TINY
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.decoding import Mismatch, SpeculativeDecoder
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.peers.vllm_env import vllm_python

TOKENS = 24


@pytest.fixture(scope="module")
def world(tiny_cfg):
    tok = load_tokenizer(tiny_cfg)
    verifier = load_verifier(tiny_cfg, torch.device("cpu"))
    eos = eos_token_ids(verifier, tok)
    ids = first_prompts(tok, resolve_source(tiny_cfg, EMBEDDED_TINY), 3, tiny_cfg.data.max_prompt_len)
    prompts = [Prompt(f"p{i}", p) for i, p in enumerate(ids)]
    ours = [SpeculativeDecoder(verifier, None, eos, TOKENS).decode(p).tokens for p in ids]
    return verifier, eos, tok.pad_token_id, prompts, ours


def with_references(cfg, engines, n):
    return dataclasses.replace(cfg, decoding=dataclasses.replace(
        cfg.decoding, reference_engines=engines, reference_prompts=n))


def test_ar_equals_hf_generate_on_the_sample(tiny_cfg, world):
    verifier, eos, pad, prompts, ours = world
    (check,) = reference_checks(with_references(tiny_cfg, ("hf_generate",), 2), verifier, eos, pad,
                                prompts, ours, TOKENS)
    assert (check.engine, check.checked, check.identical, check.absent) == ("hf_generate", 2, 2, None)


def test_a_difference_is_found_with_its_margin(tiny_cfg, world):
    verifier, eos, pad, prompts, ours = world
    wrong = [list(ours[0][:5]) + [(ours[0][5] + 1) % 100] + list(ours[0][6:]), *ours[1:]]
    (check,) = reference_checks(with_references(tiny_cfg, ("hf_generate",), 3), verifier, eos, pad,
                                prompts, wrong, TOKENS)
    (m,) = check.mismatches
    assert (m.prompt_id, m.position, m.spec_token) == ("p0", 5, ours[0][5])
    assert m.top2_margin > 0 and check.identical == 2


def test_vllm_absent_is_said_not_skipped(tiny_cfg, world, monkeypatch, tmp_path):
    verifier, eos, pad, prompts, ours = world
    monkeypatch.setenv("PEFTBD_VLLM_VENV", str(tmp_path / "none"))
    vllm_python.cache_clear()
    try:
        checks = reference_checks(with_references(tiny_cfg, ("hf_generate", "vllm"), 1), verifier,
                                  eos, pad, prompts, ours, TOKENS)
    finally:
        vllm_python.cache_clear()
    assert [c.engine for c in checks] == ["hf_generate", "vllm"]
    assert checks[1].checked == 0 and "scripts/install.sh --with-vllm" in checks[1].absent
    assert describe(reference_rows(checks)[1]).startswith("vLLM: did not run (")


def test_a_row_says_how_many_were_identical_and_where_one_differed():
    m = Mismatch("p3", 7, 1, 2, 0.0004)
    rows = reference_rows([ReferenceCheck("hf_generate", 5), ReferenceCheck("vllm", 5, [m], version="0.32.0")])
    assert [(r.engine, r.checked, r.identical) for r in rows] == [("hf_generate", 5, 5), ("vllm", 5, 4)]
    assert describe(rows[1]) == "vLLM 0.32.0: 4/5 identical (p3 from token 7, top-2 margin 0.0004)"
