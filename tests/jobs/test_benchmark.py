"""The benchmark on the tiny world with untrained drafters (tests/jobs/conftest.py's `artifacts`):
every arm's greedy output equals AR's and the counts add up; the job as users submit it, writing
results, report, figure and manifest: tests/jobs/test_job_submit.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jobs.benchmark import drafter_dirs, layout_inputs, main, run_benchmark
from peftbd.benchmarking.aggregate import add_oracles, arm_entries
from peftbd.benchmarking.arms import DrafterDirs, arm_specs, load_arm_models
from peftbd.benchmarking.concurrency import concurrency_rows
from peftbd.benchmarking.prompts import Prompt, held_out_prompts, load_prompts
from peftbd.benchmarking.runner import run_shard
from peftbd.benchmarking.sampled import SamplingPlan, sample_arms, samples
from peftbd.config import Config, apply_override, load_config
from peftbd.data.chat import encode_prompt
from peftbd.decoding import SpeculativeDecoder
from peftbd.manifest import write_manifest
from peftbd.models.loading import load_tokenizer
from peftbd.stage import StageError

from .conftest import N_PROMPTS

REAL_ARMS = tuple(s.id for s in arm_specs(load_config("tiny-full")) if s.synthetic is None)
SYNTHETIC = ("peftbd_synthetic", "fastmtp_synthetic", "peftbd_head_synthetic")  # tiny's
ARMS = (*REAL_ARMS, *SYNTHETIC)


def test_untrained_drafters_are_exact_and_counts_add_up(small_cfg: Config, artifacts: Path) -> None:
    prompts = held_out_prompts(artifacts / "continuations", N_PROMPTS).prompts
    specs = arm_specs(small_cfg)
    shard = run_shard(small_cfg, _dirs(small_cfg, artifacts), specs, prompts, repeats=2)
    arms = arm_entries(specs, [shard], {p.id: "ab"[i % 2] for i, p in enumerate(prompts)})
    add_oracles(arms)

    assert list(arms) == list(ARMS)
    ar_tokens = [r.tokens for r in shard.results["ar"][0]]
    for arm_id, arm in arms.items():
        for repeat in shard.results[arm_id]:
            assert [r.tokens for r in repeat] == ar_tokens  # greedy: identical to AR, every run
        assert [r.new_tokens for r in arm.repeats] == [sum(map(len, ar_tokens))] * 2
        assert arm.forward.verify.calls == arm.repeats[0].rounds  # 1 verify/round
        if arm_id == "ar":
            assert arm.audit is None and arm.forward.draft.calls == 0
            assert arm.mean_accepted.mean == 1.0 and arm.oracle is None
        else:
            assert arm.audit is not None and arm.oracle is not None
            assert arm.audit.exact == N_PROMPTS and arm.audit.exact_pct == 100.0
            assert arm.forward.draft.calls > 0
            assert set(arm.oracle.needed_accepted) == {"fastmtp", "ar"}
            rounds = [r for repeat in shard.results[arm_id] for res in repeat for r in res.rounds]
            pos = arm.per_position  # over both repeats
            assert sum(pos.accepted) == sum(r.accepted for r in rounds)
            assert sum(pos.proposed) == sum(r.proposed for r in rounds)
            assert all(x is not None and 0 <= x <= 1 for x in pos.rate)
            # a round's draft time holds every draft call of the round (FastMTP: mtp_steps)
            f, rnd = arm.forward.draft, arm.round
            assert f.mean_ms is not None
            assert rnd.draft_ms * len(rounds) >= 2 * f.calls * f.mean_ms
    assert len(arms["fastmtp"].per_position.proposed) == small_cfg.fastmtp.num_steps
    first_cap = small_cfg.decoding.max_new_tokens - 2  # prefill commits 1, rounds propose <= remaining - 1
    assert len(arms["peftbd"].per_position.proposed) == min(small_cfg.peftbd.block_size, first_cap)
    assert arms["peftbd_2step"].settings == {"denoise_steps": 2, "anchored": False,
                                                "block_offsets": "random"}
    assert arms["peftbd_early_exit"].settings == {
        "denoise_steps": 1, "anchored": False, "block_offsets": "random",
        "draft_layers": small_cfg.peftbd.early_exit_layers}
    assert arms["peftbd_offsets"].settings == {"denoise_steps": 1, "anchored": False,
                                                  "block_offsets": "aligned"}
    assert arms["peftbd_head"].settings == {}
    assert arms["peftbd_head_vocab"].settings == {"draft_vocab": small_cfg.peftbd_head.draft_vocab}
    drafting = [r for res in shard.results["peftbd_head"][0] for r in res.rounds if r.proposed]
    assert arms["peftbd_head"].forward.draft.calls == len(drafting)  # one forward a round
    # the offline replay on the same prompts: every one-step drafter with an offline estimate
    # (prompt lookup has none: Method.replay), the engine's rounds exactly
    replayed = set(REAL_ARMS) - {"ar", "peftbd_2step", "prompt_lookup"}
    assert {a for a, arm in arms.items() if arm.replay} == replayed
    for arm_id in replayed:
        rounds = [r for res in shard.results[arm_id][0] for r in res.rounds]
        replay = arms[arm_id].replay
        assert (replay.rounds, replay.proposed, replay.accepted) == (
            len(rounds), sum(r.proposed for r in rounds), sum(r.accepted for r in rounds)), arm_id
        assert replay.mean_accepted_prefix == pytest.approx(arms[arm_id].mean_accepted_prefix)
    # every arm's round against its floor on this CPU (one counted round, priced at the floor)
    assert shard.floor is not None and shard.floor.bytes_per_s > 0 and shard.floor.flops_per_s > 0
    for arm_id, arm in arms.items():
        assert arm.floor.verify_ms_forward > 0 and arm.floor.verify_x > 0, arm_id
        # no draft forward, no floor: AR and the model-free prompt lookup
        assert (arm.floor.draft_x is None) == (arm_id in ("ar", "prompt_lookup")), arm_id
    for arm_id in SYNTHETIC:
        assert "[synthetic: " in arms[arm_id].label and arms[arm_id].settings["synthetic"] > 1
    by_cat = arms["ar"].by_category
    assert {c: v.prompts for c, v in by_cat.items()} == {"a": 2, "b": 1}

    # the concurrency sweep: every arm at every batch size, each pass the same tokens as AR's;
    # batch 1 in both repeats, the batched passes in the first decoding.sweep_repeats (1) only
    sizes = small_cfg.decoding.batch_sizes
    assert small_cfg.decoding.sweep_repeats == 1
    assert sorted((r.arm, r.batch_size, r.repeat) for r in shard.batch_runs) == sorted(
        (a, b, k) for a in ARMS for b in sizes for k in (range(2) if b == 1 else range(1)))
    assert all(r.new_tokens == sum(map(len, ar_tokens)) and r.exact == r.prompts == N_PROMPTS
               and r.wall_s > 0 for r in shard.batch_runs)
    batch_1 = {r.arm: r for r in shard.batch_runs if r.batch_size == 1 and r.repeat == 0}
    assert all(batch_1[a].wall_s >= sum(x.decode_s for x in shard.results[a][0]) for a in ARMS)
    rows = concurrency_rows(shard.batch_runs, list(ARMS), sizes)
    assert [(r.arm, r.batch_size) for r in rows] == [(a, b) for a in ARMS for b in sizes]
    assert all(r.exact and r.tokens_per_s > 0 for r in rows)
    assert all(r.speedup_vs_ar == 1.0 for r in rows if r.arm == "ar")
    ar_1 = next(r for r in rows if r.arm == "ar" and r.batch_size == 1)
    assert ar_1.mean_accepted == 1.0
    # sampled at T = 1 (decoding.temperatures): one pass per arm but the synthetic ones, after
    # the greedy passes (their numbers and audit above untouched); every output a valid sample
    assert [(p.arm, p.temperature) for p in shard.sampled] == [(a, 1.0) for a in REAL_ARMS]
    assert all(len(p.results) == N_PROMPTS and not p.invalid for p in shard.sampled)


def test_sampled_passes_repeat_with_their_seeds(small_cfg: Config, artifacts: Path) -> None:
    # questions the world never teaches: on its own prompts the verifier samples its greedy reply
    tok = load_tokenizer(small_cfg)
    prompts = [Prompt(f"open-{i}", encode_prompt(tok, [{"role": "user", "content": q}]))
               for i, q in enumerate(("Write a short poem about the sea.",
                                      "What is your favourite colour?"))]
    specs = [s for s in arm_specs(small_cfg) if s.id in ("ar", "peftbd_head", "peftbd_synthetic")]
    models = load_arm_models(small_cfg, _dirs(small_cfg, artifacts))
    budget = small_cfg.decoding.max_new_tokens
    decoders = {s.id: SpeculativeDecoder(models.verifier_for(s), models.drafter_for(s),
                                         models.eos_ids, budget) for s in specs if samples(s)}
    vocab = models.verifier.config.vocab_size

    def tokens(seed: int) -> list[list[list[int]]]:
        passes = sample_arms(decoders, specs, SamplingPlan((1.0,), tuple(prompts), seed), vocab)
        assert [p.arm for p in passes] == ["ar", "peftbd_head"]
        assert not any(p.invalid for p in passes)
        return [[r.tokens for r in p.results] for p in passes]

    first = tokens(0)
    assert tokens(0) == first and tokens(1) != first
    assert first[0] != [decoders["ar"].decode(p.prompt_ids).tokens for p in prompts]  # not greedy


def test_spec_bench_prompts_are_balanced_over_categories(small_cfg: Config, spec_bench_path: Path,
                                                         tmp_path: Path) -> None:
    cfg = apply_override(small_cfg, "decoding.num_prompts=12")
    prompt_set = load_prompts(cfg, tmp_path / "unused", f"spec-bench:{spec_bench_path}")
    cats = prompt_set.categories()
    assert sum(cats.values()) == 12 and len(cats) >= 8  # round-robin, not the file's first 12
    assert all(p.id.startswith("spec-bench-") for p in prompt_set.prompts)


def test_the_tiny_prompt_limit_keeps_every_spec_bench_category(small_cfg: Config,
                                                              spec_bench_path: Path,
                                                              tmp_path: Path) -> None:
    """1,536 tiny tokens keeps all 13 categories (RAG's first turns are 1.1k-1.5k tiny tokens);
    only the longest summarization articles are dropped, and counted."""
    questions = [json.loads(line) for line in spec_bench_path.read_text().splitlines() if line.strip()]
    every = {q["category"] for q in questions}
    cfg = apply_override(small_cfg, f"decoding.num_prompts={len(questions)}")
    prompt_set = load_prompts(cfg, tmp_path / "unused", f"spec-bench:{spec_bench_path}")
    assert set(prompt_set.categories()) == every
    assert set(prompt_set.dropped) == {"prompt_too_long"}


def test_missing_or_unvouched_artifacts_fail_with_the_fix(small_cfg: Config, artifacts: Path,
                                                          tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(artifacts / "continuations", root / "continuations")
    with pytest.raises(StageError, match="no finished train_peftbd artifact.*jobs.train --method peftbd"):
        run_benchmark(small_cfg, root, root / "out")
    for sub in ("peftbd", "fastmtp", "peftbd_head"):
        shutil.copytree(artifacts / sub, root / sub)
    with pytest.raises(StageError, match="train_peftbd_early_exit.*draft_layers=<peftbd.early_exit_layers>"):
        run_benchmark(small_cfg, root, root / "out")
    (root / "peftbd_early_exit").mkdir()
    write_manifest(root / "peftbd_early_exit", {"stage": "train_peftbd"})  # an older layout
    with pytest.raises(SystemExit, match="error: .*peftbd_early_exit was written by an older peftbd.*--force"):
        main(["--preset", "tiny-full", "--artifacts", str(root)])


def test_early_exit_adapter_of_another_depth_is_rejected(small_cfg: Config, artifacts: Path) -> None:
    k = small_cfg.peftbd.early_exit_layers
    cfg = apply_override(small_cfg, f"peftbd.early_exit_layers={k + 1}")
    models = load_arm_models(cfg, _dirs(cfg, artifacts))
    early_exit = next(s for s in arm_specs(cfg) if s.draft_layers)  # built before any timing
    with pytest.raises(ValueError, match=f"drafts from {k} layers but peftbd.early_exit_layers={k + 1}"):
        models.drafter_for(early_exit)


def _dirs(cfg: Config, root: Path) -> DrafterDirs:
    return drafter_dirs(cfg, layout_inputs(cfg, root))[0]
