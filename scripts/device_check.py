"""The GPU checks, as one short run on a borrowed device (no Ray, no install, no network):

1. the cost profile (`peftbd.benchmarking.cost_profile`) at Qwen3-0.6B's architecture in bf16 on
   CUDA, with the `qwen3-0.6b` preset's drafters (D=16, LoRA r16/alpha32, early exit at 14 of 28
   layers, FastMTP 3 steps), on `decoding.fast_path` (auto: compiled, CUDA graphs), each arm's
   device, dtype, paths and CUDA-graph replays and skips recorded;
2. the generate stage's batched-vs-single exactness in bf16: `greedy_continuations` (the
   engine's greedy AR) over a whole batch of tiny-world prompts, as an actor runs its block,
   against each prompt alone, with the verifier's top-2 margin at every divergence (bf16
   kernels depend on the batch shape, so a near-tie may flip);
3. the engine's batched decoding in bf16: `decode_many` at batch 16 against batch 1, greedy AR
   and an untrained FastMTP head (exact rows, margins, aggregate tok/s at both);
4. AR and the synthetic arms (the paper's acceptance, `decoding.synthetic`) decoding at the
   profile's architecture, eager vs the fast path (`decoding.fast_path`), batch 1 and 16:
   aggregate tok/s, speedup vs AR, exactness vs AR, verify ms per forward against the roofline's,
   and per arm what the CUDA-graph trees did (`peftbd.decoding.graph_audit`: graphs recorded,
   replayed, skipped); the script fails loudly, after writing its JSON, when a compiled arm on
   CUDA fell back (a graph skipped, or none replayed), the profile's arms included.

Prepare here (the device gets the working tree only; `.device/` is git-ignored):

    mkdir -p .device && cp -r ~/.cache/peftbd/tiny-world-<fingerprint> .device/world

then with the device tool: command `PYTHONUNBUFFERED=1 PYTHONPATH=. python3
scripts/device_check.py --world .device/world --out $OUT`, carry `[".device"]`, timeout ~300 s.
On CPU (a dry run of the script itself): add `--device cpu --dtype float32 --quick`; a test runs
that on the tiny verifier's shape (`--preset tiny --set cost_profile.architecture=model
--fast-path off`; the fast path's CPU compiles take minutes).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from peftbd.benchmarking.cost_profile import run_profile, summary_lines
from peftbd.benchmarking.cost_profile_schema import CostProfile
from peftbd.benchmarking.cost_profile_models import activate, preflight, profile_models, profiled_specs
from peftbd.benchmarking.forward_paths import cuda_graph_fallbacks
from peftbd.config import Config, load_config
from peftbd.decoding.controlled import reference_oracle
from peftbd.data.chat import encode_prompt, prompt_messages
from peftbd.data.continuations import greedy_continuations
from peftbd.decoding import MTPDrafter, SpeculativeDecoder
from peftbd.decoding.audit import compare
from peftbd.decoding.clock import Clock
from peftbd.decoding.graph_audit import GraphAudit, audit
from peftbd.models.mtp_head import MTPHead
from peftbd.models.loading import DTYPES, eos_token_ids, resolve_device


def profile_config(preset: str, sets: list[str], device: str, dtype: str, quick: bool) -> Config:
    overrides = [f"cost_profile.device={device}", f"cost_profile.dtypes=[{dtype}]",
                 f"cost_profile.repeats={2 if quick else 5}", "cost_profile.threads=0"]
    if quick:
        overrides += ["cost_profile.kv_len=64", "cost_profile.decode_prompts=1",
                      "cost_profile.decode_tokens=8"]
    return load_config(preset, overrides=overrides + sets)


def profile(cfg: Config) -> CostProfile:
    result = run_profile(cfg)
    print("\n".join(summary_lines(result)), flush=True)
    return result


@torch.inference_mode()
def synthetic_decodes(cfg: Config, prof: CostProfile, fast_paths: list[bool], quick: bool) -> dict:
    """AR and every synthetic arm at the profile's architecture, `decode_many` at batch 1 and 16
    (16 random prompts; quick: 4), eager and/or fast path; AR's eager batch-1 outputs are the
    oracle and the reference."""
    cp, device = cfg.cost_profile, resolve_device(cfg.cost_profile.device)
    dtype = DTYPES[prof.primary_dtype]
    models = profile_models(cfg, preflight(cfg), dtype, device)
    vocab = models.verifier.config.vocab_size
    specs = [s for s in profiled_specs(cfg, vocab) if s.method == "ar" or s.synthetic is not None]
    rows, length, new = (4, 16, 8) if quick else (16, 128, 64)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for _ in range(rows)]
    references: dict[tuple[int, ...], list[int]] = {}
    oracle, clock, out = reference_oracle(references), Clock(device), {}
    roof = prof.roofline.arms
    for fast in fast_paths:
        for spec in specs:
            activate(models, spec)
            dec = SpeculativeDecoder(models.verifier_for(spec), models.drafter_for(
                spec, oracle, cfg.decoding.synthetic_seed), (), new, fast_path=fast)
            for batch in (1, 16):
                with audit() as graphs:
                    dec.decode_many(prompts[:min(batch, 2)], batch, 4)  # warm-up (and compiles)
                    start = clock.now()
                    runs = dec.decode_many(prompts, batch)
                    wall = clock.now() - start
                if not references:
                    references.update({tuple(p): r.tokens for p, r in zip(prompts, runs)})
                calls = sum(r.forward_calls.get("verify", 0) for r in runs)
                key = f"{spec.id} {'fast' if fast else 'eager'} batch {batch}"
                out[key] = {
                    "tokens_per_s": round(sum(len(r.tokens) for r in runs) / wall, 2),
                    "accepted_per_round": round(sum(len(r.tokens) - 1 for r in runs)
                                                / max(1, sum(len(r.rounds) for r in runs)), 3),
                    "exact_rows": sum(r.tokens == references[tuple(p)] for p, r in zip(prompts, runs)),
                    "verify_ms_per_forward": round(1e3 * sum(r.forward_seconds.get("verify", 0.0)
                                                             for r in runs) / max(calls, 1), 3),
                    "roofline_verify_ms": roof[spec.id].roofline_verify_ms,
                    "compile_s": round(dec.path.compile_s, 1),
                    "cuda_graphs": cuda_graphs(graphs, device, dec.path.compiled),
                    "paths": dec.forward_paths()}
                ar = out.get(f"ar {'fast' if fast else 'eager'} batch {batch}")
                out[key]["speedup_vs_ar"] = round(out[key]["tokens_per_s"] / ar["tokens_per_s"], 3)
                # like for like: every forward of the arm on AR's path (else the speedup mixes stacks)
                out[key]["like_for_like"] = set(out[key]["paths"].values()) == {ar["paths"]["verify"]}
                print(f"{key} ({prof.primary_dtype}, SYNTHETIC acceptance): {out[key]}", flush=True)
    return out


def cuda_graphs(graphs: GraphAudit, device: torch.device, compiled: bool) -> dict:
    """What the CUDA-graph trees did in one arm's run: graphs compiled, those mutating a
    non-static input (the trees would skip them), inductor's skips, recordings and replays;
    `fell_back`: a compiled arm on CUDA that did not replay CUDA graphs, or skipped one."""
    out = {"graphs_compiled": len(graphs.graphs),
           "non_static_mutations": [list(g.non_static_mutations) for g in graphs.skipped],
           "cudagraph_skips": graphs.cuda.skips,
           "recordings": graphs.cuda.recordings, "replays": graphs.cuda.replays}
    out["fell_back"] = bool(compiled and device.type == "cuda" and (
        graphs.skipped or graphs.cuda.fell_back))
    return out


def _world(world: Path, device: str, dtype: str, rows: int):
    """(tokenizer, verifier, `rows` corpus prompts, stop ids) of a built tiny world."""
    tok = AutoTokenizer.from_pretrained(world / "tokenizer")
    model = AutoModelForCausalLM.from_pretrained(world / "verifier", dtype=DTYPES[dtype])
    model = model.to(device).eval()
    lines = (world / "corpus.jsonl").read_text().splitlines()[:rows]
    prompts = [encode_prompt(tok, prompt_messages(json.loads(line)["messages"])) for line in lines]
    return tok, model, prompts, eos_token_ids(model, tok)


def batched_exactness(world: Path, device: str, dtype: str, rows: int, max_new: int) -> dict:
    _, model, prompts, eos = _world(world, device, dtype, rows)
    start = time.perf_counter()
    batched = greedy_continuations(model, prompts, max_new, eos)
    batched_s = time.perf_counter() - start
    single = greedy_continuations(model, prompts, max_new, eos, batch_size=1)
    mismatches = []
    for i, (p, b, s) in enumerate(zip(prompts, batched, single)):
        if (m := compare(model, str(i), p, s.ids, b.ids)) is not None:
            mismatches.append(m.__dict__)
    result = {"rows": len(prompts), "max_new_tokens": max_new, "dtype": dtype,
              "tokens": sum(len(b.ids) for b in batched), "exact_rows": len(prompts) - len(mismatches),
              "batched_s": round(batched_s, 3), "mismatches": mismatches}
    print(f"batched vs single greedy, {dtype} on {device}: {result['exact_rows']}/{len(prompts)} rows "
          f"exact over {result['tokens']} tokens; divergences (position, top-2 margin): "
          f"{[(m['position'], round(m['top2_margin'], 4)) for m in mismatches] or 'none'}", flush=True)
    return result


def engine_batching(world: Path, device: str, dtype: str, rows: int, max_new: int) -> dict:
    _, model, prompts, eos = _world(world, device, dtype, rows)
    clock = Clock(torch.device(device))
    torch.manual_seed(0)
    result = {}
    for name, drafter in (("ar", None), ("fastmtp_untrained", MTPDrafter(MTPHead(model), model, 3))):
        dec = SpeculativeDecoder(model, drafter, eos, max_new)
        dec.decode(prompts[0])  # warm-up
        runs = {}
        for batch in (1, 16):
            start = clock.now()
            runs[batch] = dec.decode_many(prompts, batch)
            runs[batch] = (runs[batch], sum(len(r.tokens) for r in runs[batch]) / (clock.now() - start))
        mismatches = [m.__dict__ for i, (p, a, b) in enumerate(zip(prompts, runs[1][0], runs[16][0]))
                      if (m := compare(model, str(i), p, a.tokens, b.tokens)) is not None]
        result[name] = {"exact_rows": len(prompts) - len(mismatches), "rows": len(prompts),
                        "tokens_per_s": {b: round(r[1], 1) for b, r in runs.items()},
                        "mismatches": mismatches}
        print(f"engine {name}, {dtype} on {device}: batch 16 vs 1 exact "
              f"{result[name]['exact_rows']}/{len(prompts)}; tok/s {result[name]['tokens_per_s']}; "
              f"divergences (position, top-2 margin): "
              f"{[(m['position'], round(m['top2_margin'], 4)) for m in mismatches] or 'none'}", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--out", type=Path, required=True, help="where the JSON results go")
    parser.add_argument("--world", type=Path, default=None,
                        help="a built tiny world (skip the exactness check without one)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quick", action="store_true", help="small sizes (a CPU dry run)")
    parser.add_argument("--preset", default="qwen3-0.6b", help="the config of the profile")
    parser.add_argument("--set", action="append", default=[], help="a config override, a.b=value")
    parser.add_argument("--fast-path", choices=("both", "on", "off"), default="both",
                        help="the synthetic decodes: eager and/or the compiled fast path")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"device: {name}; torch {torch.__version__}", flush=True)
    cfg = profile_config(args.preset, args.set, args.device, args.dtype, args.quick)
    prof = profile(cfg)
    result = {"device": name, "torch": torch.__version__, "cost_profile": prof.to_dict()}
    fast = {"both": [False, True], "on": [True], "off": [False]}[args.fast_path]
    result["synthetic_decodes"] = synthetic_decodes(cfg, prof, fast, args.quick)
    if args.world:
        result["batched_exactness"] = batched_exactness(
            args.world, args.device, args.dtype, 8 if args.quick else 64, 16 if args.quick else 128)
        result["engine_batching"] = engine_batching(
            args.world, args.device, args.dtype, 8 if args.quick else 64, 16 if args.quick else 128)
    (args.out / "device_check.json").write_text(json.dumps(result, indent=2, default=str))
    fell_back = [k for k, v in result["synthetic_decodes"].items() if v["cuda_graphs"]["fell_back"]]
    fell_back += [f"cost profile {a}" for a in cuda_graph_fallbacks(prof.timed_arms(), "auto")]
    if fell_back:
        raise SystemExit(f"FAILED: these compiled arms ran without CUDA graphs (skipped or never "
                         f"replayed; see cuda_graphs and cost_profile in device_check.json): "
                         f"{', '.join(fell_back)}")
    print(f"wrote {args.out / 'device_check.json'}")


if __name__ == "__main__":
    main()
