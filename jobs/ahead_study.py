"""How well the drafters that can draft ahead do it, on real acceptance: for each, the share of
rounds whose likeliest accepted length was right (the next round would use its pre-draft), and
what those pre-drafts accepted against the ordinary drafts of the same rounds, which controlled
acceptance assumes equal (`peftbd.benchmarking.ahead_study`).

    python -m jobs.ahead_study                                  # <out_dir>/tiny/peftbd if trained
    python -m jobs.ahead_study --peftbd-dir outputs/tiny/peftbd --prompts 16

Writes ahead_study.json to --out (default <paths.out_dir>/<preset>/ahead_study) and prints it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from peftbd.benchmarking.ahead_study import guess_study
from peftbd.cli import (
    add_config_args,
    add_drafter_dir_args,
    config_from_args,
    exit_on_user_error,
    output_root,
)
from peftbd.config import Config
from peftbd.data.sources import first_prompts, resolve_source
from peftbd.decoding.ahead import drafts_ahead
from peftbd.methods import methods
from peftbd.models.loading import load_tokenizer
from peftbd.serving.models import load_serving_models


def run_study(cfg: Config, dirs: dict[str, str | None], n_prompts: int) -> dict[str, Any]:
    """Every method that drafts ahead, over the first `n_prompts` prompts (`dirs`: {serving name:
    its trained dir, None: untrained}); the study's JSON, and a line per method printed."""
    models = load_serving_models(cfg, [m.serving for m in methods()], dirs)
    prompts = first_prompts(load_tokenizer(cfg), resolve_source(cfg), n_prompts,
                            cfg.serving.max_prompt_tokens)
    found = {}
    for name, decoder in models.decoders.items():
        if not drafts_ahead(decoder.drafter):
            continue
        study = guess_study(decoder, prompts, cfg.decoding.max_new_tokens)
        found[name] = {"drafter": dirs.get(name) or "untrained", **asdict(study),
                       "hit_rate": None if study.hit_rate is None else round(study.hit_rate, 3)}
        print(f"{name} ({found[name]['drafter']}): {study.rounds} rounds; the guessed accepted "
              f"length was right in {_pct(study.hit_rate)} (a pre-draft used); those pre-drafts "
              f"accepted {study.accepted_pre} tokens in their rounds against the ordinary drafts' "
              f"{study.accepted_ordinary}")
    return {"preset": cfg.preset, "prompts": len(prompts),
            "max_new_tokens": cfg.decoding.max_new_tokens, "methods": found}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.ahead_study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    add_drafter_dir_args(parser, "<out_dir>/<preset>/{id} when it holds one, else untrained")
    parser.add_argument("--prompts", type=int, default=None,
                        help="prompts to decode (default: decoding.num_prompts)")
    parser.add_argument("--out", type=Path, default=None, help="where ahead_study.json goes")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    root = output_root(cfg)
    dirs = {m.serving: getattr(args, m.dir_arg, None)
            or (str(root / m.id) if (root / m.id / "manifest.json").is_file() else None)
            for m in methods() if m.trains}
    try:
        result = run_study(cfg, dirs, args.prompts or cfg.decoding.num_prompts)
    except Exception as exc:
        exit_on_user_error(exc)  # one line `error: ...` for what the user can fix
        raise
    out = args.out or root / "ahead_study"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ahead_study.json").write_text(json.dumps(result, indent=2))
    print(f"[ahead_study] wrote {out / 'ahead_study.json'}")


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


if __name__ == "__main__":
    main()
