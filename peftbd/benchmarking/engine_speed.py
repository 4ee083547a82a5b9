"""Engine speed check (library only, no Ray):
`python -m peftbd.benchmarking.engine_speed --preset tiny --out DIR`.

On the same prompts (the first `decoding.num_prompts` corpus prompts, batch 1, EOS honoured,
`decoding.max_new_tokens`), in one run with the arms interleaved per prompt:

- greedy AR through the engine vs HF `generate(do_sample=False)`: output tokens/s, both timed
  end to end per prompt (prefill included) with the same synchronizing clock, outputs compared;
  the engine's arms on `decoding.fast_path`'s path (`paths`, and `compile_s` apart from the
  timing: the warm-up compiles);
- PEFT-BD with an untrained adapter (`drafter.*` settings): draft ms / verify ms per round and
  per forward, acceptance, exactness vs AR, and the draft-cost oracle against the measured AR.

Writes `speed.json` and `manifest.json` into DIR and prints where they went.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from peftbd.cli import add_config_args, add_stage_args, config_from_args, run_stage_job, stage_out
from peftbd.config import EMBEDDED_TINY, Config
from peftbd.benchmarking.interleaved import interleaved_timing
from peftbd.benchmarking.references import hf_generate
from peftbd.cost_model import oracle_from_metrics
from peftbd.data.sources import first_prompts, resolve_source, source_identity
from peftbd.decoding.clock import Clock
from peftbd.decoding.loop import SpeculativeDecoder
from peftbd.decoding.metrics import summarize
from peftbd.decoding.peft_bd_drafter import PeftBDDrafter
from peftbd.decoding.verify import model_device
from peftbd.layout import ENGINE_SPEED
from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier
from peftbd.models.peft_bd import attach_drafter_adapter
from peftbd.stage import StageCall, StageInputs

PEFTBD = "peftbd"
"""speed.json's key of its PEFT-BD run (this check's own format, not an arm id)."""


def run(cfg: Config) -> dict[str, Any]:
    """Measure the three arms; returns the `speed.json` content."""
    if cfg.decoding.torch_threads > 0:
        torch.set_num_threads(cfg.decoding.torch_threads)
    tokenizer = load_tokenizer(cfg)
    verifier = load_verifier(cfg)
    eos = eos_token_ids(verifier, tokenizer)
    torch.manual_seed(cfg.training.seed)
    peft_model = attach_drafter_adapter(load_verifier(cfg), cfg.peftbd, tokenizer.mask_token_id)
    prompts = first_prompts(tokenizer, resolve_source(cfg, EMBEDDED_TINY), cfg.decoding.num_prompts,
                            cfg.data.max_prompt_len)
    budget, clock = cfg.decoding.max_new_tokens, Clock(model_device(verifier))
    fast = cfg.decoding.fast_path  # both engine arms on the same path (HF generate: its own)
    engine_ar = SpeculativeDecoder(verifier, None, eos, budget, fast_path=fast)
    drafter = PeftBDDrafter(peft_model, tokenizer.mask_token_id, cfg.peftbd.block_size,
                            cfg.peftbd.denoise_steps, cfg.peftbd.anchored)
    engine_bd = SpeculativeDecoder(peft_model, drafter, eos, budget, fast_path=fast)
    bd_results = []

    def hf(ids: list[int]) -> list[int]:
        return hf_generate(verifier, [ids], budget, eos, tokenizer.pad_token_id)[0]

    def peftbd(ids: list[int]) -> list[int]:
        bd_results.append(engine_bd.decode(ids))
        return bd_results[-1].tokens

    arms = {"hf_generate": hf, "engine_ar": lambda ids: engine_ar.decode(ids).tokens, PEFTBD: peftbd}
    interleaved_timing(arms, prompts[:2], 1, clock)  # warm-up: first-call allocations, lazy inits
    bd_results.clear()
    outputs, seconds = interleaved_timing(arms, prompts, cfg.decoding.repeats, clock)
    tokens = {name: sum(len(o) for o in outs) for name, outs in outputs.items()}
    tps = {name: [tokens[name] / sum(rep) for rep in secs] for name, secs in seconds.items()}
    mean_tps = {name: sum(v) / len(v) for name, v in tps.items()}
    # best of the repeats per prompt: the least disturbed timing on a shared machine
    best_tps = {name: tokens[name] / sum(map(min, zip(*secs))) for name, secs in seconds.items()}
    bd = summarize(bd_results)
    engines = {"engine_ar": engine_ar, PEFTBD: engine_bd}
    return {
        "prompts": len(prompts), "max_new_tokens": budget, "repeats": cfg.decoding.repeats,
        "torch_threads": torch.get_num_threads(), "device": str(clock.device),
        # which path each forward of each arm ran (`SpeculativeDecoder.forward_paths`): the
        # engine's verify compiled on `decoding.fast_path` (the compile time apart, in the
        # warm-up), its drafts eager; HF generate always eager
        "paths": {"hf_generate": {"generate": "eager"},
                  **{n: e.forward_paths() for n, e in engines.items()}},
        "compile_s": {n: e.path.compile_s for n, e in engines.items()},
        "tokens_per_s": mean_tps, "tokens_per_s_per_repeat": tps, "tokens_per_s_best": best_tps,
        "new_tokens": tokens,
        "engine_ar_vs_hf": mean_tps["engine_ar"] / mean_tps["hf_generate"],
        "engine_ar_vs_hf_best": best_tps["engine_ar"] / best_tps["hf_generate"],
        "engine_ar_vs_hf_per_repeat": [e / h for e, h in zip(tps["engine_ar"], tps["hf_generate"])],
        "exact_vs_hf": sum(a == b for a, b in zip(outputs["engine_ar"], outputs["hf_generate"])),
        "peftbd_exact_vs_ar": sum(a == b for a, b in zip(outputs[PEFTBD], outputs["engine_ar"])),
        PEFTBD: {
            "draft_over_verify_round": bd["round"]["draft_ms"] / bd["round"]["verify_ms"],
            "draft_over_verify_forward": bd["forward"]["draft"]["mean_ms"] / bd["forward"]["verify"]["mean_ms"],
            "metrics": bd,
            "oracle": oracle_from_metrics(bd, {"engine_ar": mean_tps["engine_ar"]}),
        },
    }


def speed_call(cfg: Config, out_dir: Path) -> StageCall:
    """The engine speed check as a stage (`peftbd.layout.ENGINE_SPEED`) writing `out_dir`."""
    def build(tmp: Path, _inputs: StageInputs) -> dict[str, Any]:
        result = run(cfg)
        (tmp / "speed.json").write_text(json.dumps(result, indent=2))
        return {"metrics": {k: result[k] for k in ("tokens_per_s", "engine_ar_vs_hf", "engine_ar_vs_hf_best")}}

    return StageCall(ENGINE_SPEED, cfg.to_dict(), out_dir, {}, build,
                     extra={"source": source_identity(cfg)})  # a local source: its content


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m peftbd.benchmarking.engine_speed",
                                     description=__doc__.split("\n\n")[0])
    add_config_args(parser)
    add_stage_args(parser, ENGINE_SPEED)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    out = stage_out(args, cfg, ENGINE_SPEED)
    run_stage_job(ENGINE_SPEED, out, lambda: speed_call(cfg, out), args.force, args.verbose)
    result = json.loads((out / "speed.json").read_text())
    print(f"engine AR {result['tokens_per_s']['engine_ar']:.1f} tok/s vs HF generate "
          f"{result['tokens_per_s']['hf_generate']:.1f} tok/s ({result['engine_ar_vs_hf']:.2f}x mean, "
          f"{result['engine_ar_vs_hf_best']:.2f}x best-of-repeats); "
          f"PEFT-BD draft/verify per round {result[PEFTBD]['draft_over_verify_round']:.2f}")
    print(f"wrote {out / 'speed.json'} and {out / 'manifest.json'}")


if __name__ == "__main__":
    main()
