"""The speed check runs end to end on a tiny slice; its outputs are exact (timings are not asserted)."""

from __future__ import annotations

import json

import pytest

from peftbd.benchmarking.engine_speed import main


def test_speed_check_writes_exact_comparisons(tmp_path, capsys):
    out = tmp_path / "speed"
    main(["--preset", "tiny", "--out", str(out), "--set", "decoding.num_prompts=2",
          "--set", "decoding.repeats=1", "--set", "decoding.max_new_tokens=6",
          "--set", "decoding.torch_threads=1"])
    result = json.loads((out / "speed.json").read_text())
    assert result["prompts"] == 2
    assert result["exact_vs_hf"] == 2 and result["peftbd_exact_vs_ar"] == 2  # engine AR == HF generate
    assert result["new_tokens"]["engine_ar"] == result["new_tokens"]["hf_generate"]
    assert set(result["peftbd"]["oracle"]["needed_accepted"]) == {"engine_ar"}
    assert result["paths"] == {"hf_generate": {"generate": "eager"}, "engine_ar": {"verify": "eager"},
                               "peftbd": {"verify": "eager", "draft": "eager"}}
    assert (out / "manifest.json").is_file() and str(out / "speed.json") in capsys.readouterr().out


@pytest.mark.slow  # compiles the verify graph (~15-30 s on 2 cores)
def test_the_fast_path_switch_reaches_both_engine_arms(tmp_path):
    import torch

    torch._dynamo.reset()  # dynamo's graph cache is per process: another test may have compiled it
    out = tmp_path / "speed"
    main(["--preset", "tiny", "--out", str(out), "--set", "decoding.num_prompts=1",
          "--set", "decoding.repeats=1", "--set", "decoding.max_new_tokens=4",
          "--set", "decoding.torch_threads=1", "--set", "decoding.fast_path=true"])
    result = json.loads((out / "speed.json").read_text())
    assert result["paths"] == {"hf_generate": {"generate": "eager"},
                               "engine_ar": {"verify": "compiled"},
                               "peftbd": {"verify": "compiled", "draft": "compiled"}}
    assert result["compile_s"]["engine_ar"] > 0  # the warm-up compiled its verify graph
    assert result["exact_vs_hf"] == 1 and result["peftbd_exact_vs_ar"] == 1
