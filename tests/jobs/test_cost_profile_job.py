"""The cost-profile job's command line: it teaches, and bad settings stop it before Ray starts."""

from __future__ import annotations

import time

import pytest

from jobs.cost_profile import main


def test_help_names_the_architecture_the_kv_length_and_the_output(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for word in ("cost_profile.architecture", "cost_profile.kv_len", "cost_profile.json", "--out"):
        assert word in out, word


def test_an_early_exit_deeper_than_the_architecture_fails_at_once(tmp_path):
    start = time.monotonic()
    with pytest.raises(SystemExit) as exit_:
        main(["--out", str(tmp_path / "cp"), "--set", "cost_profile.early_exit_layers=28"])
    assert "cost_profile.early_exit_layers=28: Qwen/Qwen3-0.6B has 28 layers; use 1..27" in str(exit_.value)
    assert time.monotonic() - start < 120 and not (tmp_path / "cp").exists()


def test_the_architecture_a_name_points_at_is_an_input_of_its_own(tmp_path):
    """`cost_profile.architecture` names a directory (or `model`, the run's verifier): when what
    it holds changes, the profile reruns, though no config value did."""
    from transformers import Qwen3Config

    from jobs.cost_profile import cost_profile_call
    from peftbd.config import load_config

    def decide(hidden_size: int):
        Qwen3Config(hidden_size=hidden_size, num_hidden_layers=2).save_pretrained(tmp_path / "arch")
        cfg = load_config("tiny", overrides=[f"cost_profile.architecture={tmp_path / 'arch'}",
                                             "cost_profile.early_exit_layers=1"])
        return cost_profile_call(cfg, tmp_path / "cp")

    first = decide(64).inputs()
    assert first.fingerprint != decide(128).inputs().fingerprint
    assert first.fingerprint == decide(64).inputs().fingerprint
    assert first.extra["architecture"]["config"]["hidden_size"] == 64
