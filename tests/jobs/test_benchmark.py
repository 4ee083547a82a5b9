"""The benchmark on the tiny world with untrained drafters: every arm's greedy output equals AR's,
the counts add up, and the job writes results, report, figure and manifest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import pyarrow as pa
import pytest
import torch

from jobs.benchmark import RESULTS, drafter_dirs, layout_inputs, main, run_benchmark
from peftbd.peers.vllm_env import absent_reason
from peftbd.analysis.report import FIGURE_1, FIGURE_3, FIGURE_5, REPORT
from peftbd.benchmarking.aggregate import add_oracles, arm_entries
from peftbd.benchmarking.arms import DrafterDirs, arm_specs, load_arm_models
from peftbd.benchmarking.concurrency import concurrency_rows
from peftbd.benchmarking.prompts import Prompt, held_out_prompts, load_prompts
from peftbd.benchmarking.runner import run_shard
from peftbd.benchmarking.sampled import SamplingPlan, sample_arms, samples
from peftbd.benchmarking.schema import Results
from peftbd.config import Config, apply_override, load_config
from peftbd.data.artifact import write_split
from peftbd.data.chat import encode_prompt, prompt_messages
from peftbd.decoding import SpeculativeDecoder
from peftbd.manifest import read_manifest, write_manifest
from peftbd.models.loading import load_tokenizer
from peftbd.stage import StageError
from peftbd.methods import methods

REAL_ARMS = tuple(s.id for s in arm_specs(load_config("tiny-full")) if s.synthetic is None)
SYNTHETIC = ("peftbd_synthetic", "fastmtp_synthetic", "peftbd_head_synthetic")  # tiny's
ARMS = (*REAL_ARMS, *SYNTHETIC)
N_PROMPTS = 3


@pytest.fixture(scope="module")
def small_cfg() -> Config:
    """The full study's arms (tiny-full: the ablations too) on a few short prompts, every arm in
    the concurrency sweep at batch 1 and 2 (a batch below N_PROMPTS: requests join as others end)."""
    cfg = load_config("tiny-full")
    for item in (f"decoding.num_prompts={N_PROMPTS}", "decoding.max_new_tokens=12",
                 "decoding.repeats=2", "decoding.torch_threads=1", "decoding.batch_sizes=[1,2]",
                 "decoding.sweep_variants=true"):
        cfg = apply_override(cfg, item)
    return cfg


@pytest.fixture(scope="module")
def artifacts(small_cfg: Config, tiny_world, tmp_path_factory, make_artifact) -> Path:
    """A pipeline output root: a test split of corpus prompts and untrained drafters exported by
    the training tasks (as the training jobs export them)."""
    root = tmp_path_factory.mktemp("artifacts")
    tok = load_tokenizer(small_cfg)
    rows = []
    with open(tiny_world.corpus_path) as f:
        for line in f:
            rec = json.loads(line)
            ids = encode_prompt(tok, prompt_messages(rec["messages"]))
            rows.append({"id": rec["id"], "source": "test", "split": "test", "prompt_ids": ids,
                         "continuation_ids": [], "prompt_len": len(ids), "continuation_len": 0,
                         "finish_reason": "length", "category": None})
            if len(rows) == N_PROMPTS + 2:
                break
    train = [{**r, "id": f"train-{r['id']}", "split": "train", "continuation_ids": r["prompt_ids"],
              "continuation_len": r["prompt_len"]} for r in rows]  # counted for the draft vocabulary
    make_artifact(root / "continuations",
                  lambda tmp: (write_split(tmp, "test", pa.Table.from_pylist(rows)),
                               write_split(tmp, "train", pa.Table.from_pylist(train))),
                  wall_seconds=11.5, peak_rss_mib=512.0, peak_gpu_mib=None)
    torch.manual_seed(0)
    for method in methods():  # every registered method's training stages, as the main job runs them
        for spec, cfg in method.training_stages(small_cfg):
            task = method.task(cfg)
            module = task.build(torch.device("cpu"))
            make_artifact(root / spec.subdir, lambda tmp, t=task, m=module: t.export(m, tmp),
                          stage=spec.name, untrained=True, wall_seconds=0.5, peak_rss_mib=400.0)
    return root


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


@pytest.mark.integration
@pytest.mark.slow
def test_benchmark_job_writes_results_report_and_manifest(small_cfg: Config, artifacts: Path,
                                                          tmp_path: Path) -> None:
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = False
    out = run_benchmark(small_cfg, artifacts, tmp_path / "benchmark", repeats=1)
    written = json.loads((out / RESULTS).read_text())
    results = Results.from_dict(written)  # the file reads back as what was written
    assert json.loads(results.to_json()) == written
    # the tiny preset's two timing workers: each times its share, results.json merges them
    assert results.prompts.count == N_PROMPTS and results.timing.workers == 2
    assert all(len(arm.repeats) == 1 for arm in results.arms.values())
    assert all(arm.audit is not None and arm.audit.exact_pct == 100.0
               for arm in results.arms.values() if arm.speculative)
    assert results.drafters["peftbd"].untrained is True
    vocab = results.drafters["peftbd_head"].draft_vocab
    assert vocab is not None
    assert vocab["size"] == small_cfg.peftbd_head.draft_vocab and 0 < vocab["train_token_coverage"] <= 1
    report = (out / REPORT).read_text()
    assert "Table 3" in report and "| generate continuations | 11.5 | 512 |" in report
    assert mpimg.imread(out / FIGURE_1).shape[0] > 200
    sizes = list(small_cfg.decoding.batch_sizes)
    rows = results.concurrency
    assert [(r.arm, r.batch_size) for r in rows] == [(a, b) for a in ARMS for b in sizes]
    assert all(r.exact for r in rows) and results.timing.batch_sizes == sizes
    assert "Table 8" in report and "Engine goal: AR at batch 16" in report
    assert mpimg.imread(out / FIGURE_3).shape[0] > 200
    sampling = results.sampling  # both workers' sampled passes, merged
    assert sampling is not None
    assert sampling.temperatures == [0.0, 1.0] and sampling.prompts == N_PROMPTS
    assert all(e.check is not None and e.check.valid == N_PROMPTS
               for arm in sampling.arms.values() for e in arm.by_temperature if e.temperature > 0)
    assert "Table 11" in report and mpimg.imread(out / FIGURE_5).shape[0] > 200
    manifest = read_manifest(out)
    assert manifest["stage"] == "benchmark" and manifest["wall_seconds"] > 0
    assert manifest["workers"]["workers"] == 2 and manifest["workers"]["peak_rss_mib"] > 0
    assert manifest["workers"]["dtype"] == "float32"
    assert len(manifest["summary"]) == len(ARMS) + 1  # each arm, then AR vs independent engines
    assert manifest["summary"][-1].startswith("AR vs independent engines: HF generate: ")
    # one shard checks AR against HF generate and vLLM (run from its Ray worker where installed:
    # CI installs it; else said absent with the install command)
    refs = {r.engine: r for r in results.references}
    assert refs["hf_generate"].identical == refs["hf_generate"].checked > 0
    vllm = refs["vllm"]
    assert (vllm.identical == vllm.checked > 0 if absent_reason() is None
            else "install.sh --with-vllm" in str(vllm.absent)), vllm


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
