"""The cost profile: its structure, that every arm runs through the engine's own drafters, and
that no draft forward copies a vocabulary-sized matrix (timings are not asserted)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from peftbd.benchmarking import cost_profile as cp
from peftbd.benchmarking import cost_profile_models as cpm
from peftbd.benchmarking.cost_profile_schema import CostProfile
from peftbd.benchmarking.forward_counter import ForwardCounter
from peftbd.benchmarking.forward_paths import CudaGraphsFellBack, cuda_graph_fallbacks
from peftbd.config import ConfigError, load_config
from peftbd.decoding import BDHeadDrafter, MTPDrafter, PeftBDDrafter, SpeculativeDecoder
from peftbd.decoding.drafter import NoDrafter
from peftbd.methods.prompt_lookup import PromptLookupDrafter
from peftbd.models.architecture import QWEN3_0_6B, resolve_architecture
from peftbd.models.loading import ModelUnavailableError, load_verifier
from peftbd.models.peft_bd import adapter_on, draft_input_ids

TINY_PROFILE = ["cost_profile.architecture=model", "cost_profile.early_exit_layers=1",
                "cost_profile.repeats=2", "cost_profile.kv_len=48",
                "cost_profile.dtypes=[float32, bfloat16]", "cost_profile.decode_prompts=2",
                "cost_profile.decode_tokens=20"]


@pytest.fixture(scope="module")
def tiny_profile(tiny_world):
    return cp.run_profile(load_config("tiny-full", overrides=TINY_PROFILE)).to_dict()


def test_the_profile_holds_every_arm_per_dtype_with_its_round(tiny_profile):
    cfg = load_config("tiny-full", overrides=TINY_PROFILE)
    ids = [s.id for s in cpm.profiled_specs(cfg)]
    assert ids == ["ar", "peftbd", "peftbd_2step", "peftbd_anchored", "peftbd_early_exit",
                   "peftbd_offsets", "fastmtp", "peftbd_head", "peftbd_head_vocab",
                   "dflash", "dflash_2layers", "dflash_5layers", "prompt_lookup", "peftbd_synthetic",
                   "fastmtp_synthetic", "peftbd_head_synthetic"]
    prof = json.loads(json.dumps(tiny_profile))  # JSON as written
    assert CostProfile.from_dict(prof).to_dict() == prof  # and read back as the same profile
    assert list(prof["profiles"]) == ["float32", "bfloat16"]
    assert prof["kv_len"] == 48 and prof["repeats"] == 2 and prof["threads"] == cfg.cost_profile.threads
    assert prof["device"] == "cpu" and prof["architecture"]["layers"] == 2
    tiny_params = sum(p.numel() for p in load_verifier(cfg).parameters())
    assert prof["architecture"]["parameters"] == tiny_params  # the backbone, no adapter counted
    assert 0 < prof["architecture"]["draft_parameters"]["train_peftbd_head"] < tiny_params
    d, steps = cfg.peftbd.block_size, cfg.fastmtp.num_steps
    for run in prof["profiles"].values():
        arms = run["arms"]
        assert list(arms) == ids
        for arm in arms.values():
            assert arm["draft_ms_round"] >= 0 and arm["verify_ms_round"] > 0
            assert arm["draft_over_verify_round"] == pytest.approx(
                arm["draft_ms_round"] / arm["verify_ms_round"], rel=1e-2, abs=1e-3)
            assert arm["kv_len"] > 48  # the prompt's KV plus the warm-up round's tokens
        assert (arms["ar"]["proposed"], arms["ar"]["draft_calls"]) == (0, 0)
        assert (arms["peftbd"]["proposed"], arms["peftbd"]["draft_calls"]) == (d, 1)
        assert arms["peftbd_2step"]["draft_calls"] == 2
        assert (arms["fastmtp"]["proposed"], arms["fastmtp"]["draft_calls"]) == (steps, steps)
        for head in ("peftbd_head", "peftbd_head_vocab"):  # one forward drafts the whole block
            assert (arms[head]["proposed"], arms[head]["draft_calls"]) == (d, 1)
        assert run["mask_row"]["peft_wrappers_ms"] > 0 and run["mask_row"]["engine_ms"] > 0
        assert arms["peftbd_offsets"]["same_as"] == "peftbd" and arms["peftbd"]["same_as"] is None
        assert arms["peftbd_offsets"]["draft_ms_round"] == arms["peftbd"]["draft_ms_round"]
        assert "offsets" in arms["peftbd_offsets"]["label"]
        assert arms["peftbd_synthetic"]["same_as"] == "peftbd"  # its cost is its drafter's
    work = prof["roofline"]["arms"]
    assert list(work) == ids and prof["roofline"]["gpu"]["name"] == "H200"
    assert work["peftbd_2step"]["draft_forwards"] == 2 and work["ar"]["draft_forwards"] == 0
    # the same backbone: a 1-step draft reads what a verify reads; early exit reads about half
    assert work["peftbd"]["draft_mb"] == pytest.approx(work["peftbd"]["verify_mb"], rel=0.1)
    assert work["peftbd_early_exit"]["draft_gflops"] < 0.75 * work["peftbd"]["draft_gflops"]
    assert work["ar"]["verify_gflops"] < work["peftbd"]["verify_gflops"]


def test_ar_and_the_synthetic_arms_decode_whole_requests_exactly_at_their_targets(tiny_profile):
    dec = json.loads(json.dumps(tiny_profile))["decode"]
    cfg = load_config("tiny-full", overrides=TINY_PROFILE)
    assert list(dec["arms"]) == ["ar", "peftbd_synthetic", "fastmtp_synthetic",
                                 "peftbd_head_synthetic"]
    assert (dec["prompts"], dec["prompt_len"], dec["dtype"]) == (2, 48, "float32")
    floor = dec["floor"]
    assert floor["bytes_per_s"] > 1e8 and floor["flops_per_s"] > 1e8 and "measured" in floor["source"]
    for arm_id, arm in dec["arms"].items():
        assert arm["exact"], arm_id  # every output is AR's
        assert arm["tokens"] == 2 * (cfg.cost_profile.decode_tokens - 1)  # no EOS; prefill made 1
        assert arm["verify_x_over_floor"] > 0 and arm["floor_verify_ms_forward"] > 0
        assert arm["host_ms_round"] >= 0
    assert dec["arms"]["ar"]["mean_accepted"] == 1.0 and dec["arms"]["ar"]["speedup_vs_ar"] == 1.0
    head = dec["arms"]["peftbd_head_synthetic"]
    assert head["mean_accepted"] > dec["arms"]["fastmtp_synthetic"]["mean_accepted"]  # 5.3 vs 1.5
    assert head["draft_x_over_floor"] > 0 and head["rounds"] < dec["arms"]["ar"]["rounds"]


def test_every_arm_says_what_ran_eager_on_a_cpu_under_auto(tiny_profile):
    """decoding.fast_path: auto is eager on a CPU: each arm records its device, dtype and
    forward paths, and no CUDA-graph counts (None off CUDA); the summary names them once."""
    prof = CostProfile.from_dict(tiny_profile)
    for dtype, run in prof.profiles.items():
        for arm_id, arm in run.arms.items():
            assert (arm.device, arm.dtype) == ("cpu", dtype), arm_id
            assert (arm.cuda_graph_replays, arm.cuda_graph_skips) == (None, None), arm_id
        assert run.arms["ar"].paths == {"verify": "eager"}
        assert run.arms["peftbd"].paths == {"verify": "eager", "draft": "eager"}
        assert run.arms["prompt_lookup"].paths == {"verify": "eager"}  # no draft forward
    assert prof.decode is not None
    assert {(a.device, a.dtype, a.cuda_graph_replays) for a in prof.decode.arms.values()} == {
        ("cpu", "float32", None)}
    assert prof.decode.arms["peftbd_synthetic"].paths == {"verify": "eager", "draft": "eager"}
    lines = cp.summary_lines(prof)
    assert lines[1].startswith("  float32 on cpu, every forward eager: AR step ")
    assert lines[2].startswith("  bfloat16 on cpu, every forward eager: AR step ")
    assert "(float32 on cpu, every forward eager, 2 prompts" in lines[-1]
    assert not any("FELL BACK" in line for line in lines)


def test_an_arm_without_cuda_graphs_is_an_error_on_true_and_a_loud_line_on_auto(tiny_profile):
    prof = CostProfile.from_dict(tiny_profile)
    for arm in prof.timed_arms().values():  # as compiled on CUDA, every graph replayed
        arm.device, arm.cuda_graph_replays, arm.cuda_graph_skips = "cuda:0", 12, 0
    assert cuda_graph_fallbacks(prof.timed_arms(), True) == []
    assert not any("FELL BACK" in line for line in cp.summary_lines(prof))
    skipped = prof.profiles["bfloat16"].arms["peftbd"]
    skipped.cuda_graph_replays, skipped.cuda_graph_skips = 3, 2
    with pytest.raises(CudaGraphsFellBack, match=r"bfloat16 peftbd \(3 replays, 2 skips\)"):
        cuda_graph_fallbacks(prof.timed_arms(), True)
    assert cuda_graph_fallbacks(prof.timed_arms(), "auto") == ["bfloat16 peftbd"]
    assert cp.summary_lines(prof)[-1] == (
        "  CUDA GRAPHS FELL BACK in bfloat16 peftbd (3 replays, 2 skips): those arms' compiled "
        "forwards ran without CUDA graphs, so their times are not the fast path's "
        "(decoding.fast_path=true makes this an error)")


@pytest.mark.slow  # compiles every round forward of three arms on the CPU (~75 s on 2 cores)
def test_decoding_fast_path_true_times_every_arm_compiled(tiny_world, monkeypatch):
    torch._dynamo.reset()  # dynamo's graph cache is per process: another test may have compiled it
    cfg = load_config("tiny", overrides=[*TINY_PROFILE, "cost_profile.dtypes=[float32]",
                                         "cost_profile.repeats=1", "cost_profile.decode_prompts=1",
                                         "cost_profile.decode_tokens=6", "decoding.fast_path=true"])
    specs = {s.id: s for s in cpm.profiled_specs(cfg)}
    monkeypatch.setattr(cp, "profiled_specs", lambda cfg, vocab: [
        specs[a] for a in ("ar", "peftbd", "peftbd_synthetic")])
    prof = cp.run_profile(cfg)
    arms = prof.profiles["float32"].arms
    assert arms["ar"].paths == {"verify": "compiled"}
    assert arms["peftbd"].paths == {"verify": "compiled", "draft": "compiled"}
    assert prof.decode is not None and prof.decode.arms["peftbd_synthetic"].paths == {
        "verify": "compiled", "draft": "compiled"}
    assert prof.decode.arms["peftbd_synthetic"].exact  # compiled decodes give AR's tokens
    assert {(a.device, a.cuda_graph_replays, a.cuda_graph_skips)
            for a in prof.timed_arms().values()} == {("cpu", None, None)}  # no CUDA graphs on a CPU
    assert cp.summary_lines(prof)[1].startswith("  float32 on cpu, every forward compiled: ")


def test_cuda_named_where_this_process_sees_none_is_an_error_naming_the_field(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"cost_profile.device=cuda: this process sees 0 CUDA"):
        cp.profile_device("cuda")
    assert cp.profile_device("auto") == torch.device("cpu")


@pytest.mark.slow  # a second whole profile (~13 s); the quick loop's one above times every arm
def test_every_arm_drafts_through_the_engine_s_own_drafter(tiny_world, monkeypatch):
    """The profiler holds no drafting code: each arm's round is `SpeculativeDecoder.step` with
    the benchmark's drafter class, every timed round included."""
    seen: list[tuple[str, int]] = []
    step = SpeculativeDecoder.step

    def spy(self, state):
        seen.append((type(self.drafter).__name__, self.drafter.depth
                     if isinstance(self.drafter, PeftBDDrafter) else 0))
        return step(self, state)

    monkeypatch.setattr(SpeculativeDecoder, "step", spy)
    cfg = load_config("tiny", overrides=[*TINY_PROFILE, "cost_profile.dtypes=[float32]",
                                         "cost_profile.repeats=1", "cost_profile.decode_tokens=0"])
    assert cp.run_profile(cfg).decode is None  # rounds only: no measured decode
    kinds = {name for name, _ in seen}
    assert kinds == {NoDrafter.__name__, PeftBDDrafter.__name__, MTPDrafter.__name__,
                     BDHeadDrafter.__name__, PromptLookupDrafter.__name__}
    # per timed arm: warm-up + counted round + 1 timed round (the offsets ablation drafts as
    # peftbd does, so it is timed once; DFlash at three depths); the early-exit arm drafts from 1 layer
    assert len(seen) == 12 * 3
    assert sorted({depth for name, depth in seen if name == "PeftBDDrafter"}) == [1, 2]


def test_bad_settings_fail_before_anything_is_built(tiny_world):
    cfg = load_config("tiny", overrides=["cost_profile.architecture=model",
                                         "cost_profile.early_exit_layers=2"])
    with pytest.raises(ValueError, match=r"cost_profile.early_exit_layers=2: .* has 2 layers"):
        cpm.preflight(cfg)


def test_the_paper_s_architecture_needs_no_network(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    arch = resolve_architecture(load_config("tiny"))
    assert arch.name == QWEN3_0_6B and arch.origin == "embedded config" and arch.weights_dir is None
    c = arch.config
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size, c.num_key_value_heads) == (28, 1024, 151936, 8)
    assert c.tie_word_embeddings

    local = tmp_path / "shape-only"
    local.mkdir()
    c.save_pretrained(local)
    arch = resolve_architecture(load_config("tiny", overrides=[f"cost_profile.architecture={local}"]))
    assert arch.origin.startswith("local directory") and arch.weights_dir is None
    with pytest.raises(ModelUnavailableError, match="cost_profile.architecture"):
        resolve_architecture(load_config("tiny", overrides=["cost_profile.architecture=acme/none"]))
    with pytest.raises(ModelUnavailableError, match="without config.json"):
        resolve_architecture(load_config("tiny", overrides=[f"cost_profile.architecture={tmp_path}"]))


@pytest.fixture(scope="module")
def real_vocab_models():
    """The profile's models on a stand-in with Qwen3-0.6B's vocabulary (151,936 rows), narrow."""
    cfg = load_config("tiny", overrides=["cost_profile.early_exit_layers=1"])
    config = Qwen3Config(vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                         tie_word_embeddings=True)
    arch = cpm.Architecture("stand-in", config, "test", None)
    monkey = pytest.MonkeyPatch()
    monkey.setattr(cpm, "build_model", lambda arch, dtype, device, attn: Qwen3ForCausalLM(
        arch.config).to(dtype).eval().requires_grad_(False))
    models = cpm.profile_models(cfg, arch, torch.float32, torch.device("cpu"))
    monkey.undo()
    return cfg, models


def test_no_draft_forward_copies_a_vocabulary_sized_matrix(real_vocab_models):
    cfg, models = real_vocab_models
    table = 151936 * 64
    for spec in cpm.profiled_specs(cfg):
        if spec.method == "ar" or spec.synthetic is not None:  # a synthetic arm drafts as its arm
            continue
        cpm.activate(models, spec)
        engine = SpeculativeDecoder(models.verifier_for(spec), models.drafter_for(spec), (), 1 << 10)
        state = engine.start(list(range(40)))
        counter = ForwardCounter()
        with torch.inference_mode():
            engine.step(state)  # FastMTP's head first catches up with the whole prompt
            state.forwards.observer = counter.forward
            engine.step(state)
        drafts = [f for f in counter.forwards if f.mode == "draft"]
        assert drafts, spec.id
        biggest = max(drafts, key=lambda f: f.largest_output)
        assert biggest.largest_output < table // 2, (spec.id, biggest.largest_output_op)


def test_the_counter_sees_a_copy_when_there_is_one(real_vocab_models):
    """peft's trainable-token wrapper (the path the engine avoids) copies the whole table per call:
    the check above would fail on it."""
    _, models = real_vocab_models
    peft = models.modules["train_peftbd"]
    base = models.verifier
    counter = ForwardCounter()
    ids = draft_input_ids(0, models.mask_id, 16)
    with torch.inference_mode(), adapter_on(peft), counter.forward("draft"):
        base.get_input_embeddings()(ids)
    assert counter.forwards[0].largest_output >= 151936 * 64
