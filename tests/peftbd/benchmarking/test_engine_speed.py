"""The speed check runs end to end on a tiny slice; its outputs are exact (timings are not asserted)."""

from __future__ import annotations

import json

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
    assert (out / "manifest.json").is_file() and str(out / "speed.json") in capsys.readouterr().out
