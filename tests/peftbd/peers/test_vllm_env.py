"""Where the project looks for vLLM, and what it says when vLLM is not there; the line protocol's
messages (no vLLM needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from peftbd.peers import vllm_env
from peftbd.peers.vllm_env import INSTALL, VllmAbsent, absent_reason, vllm_python
from peftbd.peers.vllm_protocol import REPLY, REQUEST, Failed, Generate, Generated, Load, NgramSpec

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def venv(monkeypatch, tmp_path):
    """PEFTBD_VLLM_VENV at an empty dir, the lookup's cache cleared before and after."""
    monkeypatch.setenv("PEFTBD_VLLM_VENV", str(tmp_path / "venv"))
    vllm_python.cache_clear()
    yield tmp_path / "venv"
    vllm_python.cache_clear()


def test_a_missing_environment_says_how_to_install_vllm(venv):
    with pytest.raises(VllmAbsent, match="bash scripts/install.sh --with-vllm"):
        vllm_python()
    assert INSTALL in absent_reason()


def test_an_environment_without_vllm_is_absent_too(venv):
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    with pytest.raises(VllmAbsent, match=f"not installed in {venv}"):
        vllm_python()


def test_the_default_environment_is_the_repo_s_dot_venv_vllm(monkeypatch, tmp_path):
    monkeypatch.delenv("PEFTBD_VLLM_VENV", raising=False)
    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path))  # no install record
    assert vllm_env.venv_dir() == REPO / ".venv-vllm"


def test_a_copy_of_the_code_without_one_finds_the_environment_the_install_recorded(monkeypatch,
                                                                                   tmp_path):
    """As a `ray job submit` working dir (a copy without the git-ignored .venv-vllm) does: the
    record install.sh --with-vllm wrote in the cache dir, while what it names exists."""
    monkeypatch.delenv("PEFTBD_VLLM_VENV", raising=False)
    monkeypatch.setattr(vllm_env, "REPO", tmp_path / "uploaded")
    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    installed = tmp_path / "checkout" / ".venv-vllm"
    (tmp_path / "cache" / vllm_env.RECORD).write_text(f"{installed}\n")
    assert vllm_env.venv_dir() == tmp_path / "uploaded" / ".venv-vllm"  # gone: not trusted
    installed.mkdir(parents=True)
    assert vllm_env.venv_dir() == installed
    (tmp_path / "uploaded" / ".venv-vllm").mkdir(parents=True)
    assert vllm_env.venv_dir() == tmp_path / "uploaded" / ".venv-vllm"  # the copy's own first


def test_install_records_the_environment_it_made():
    script = (REPO / "scripts" / "install.sh").read_text()
    assert f'> "$record_dir/{vllm_env.RECORD}"' in script


def test_messages_round_trip_by_their_kind():
    load = Load(model_dir="/m", max_model_len=64, max_num_seqs=16,
                ngram=NgramSpec(num_tokens=8, min_ngram=2, max_ngram=4))
    gen = Generate(prompts=[[1, 2], [3]], max_tokens=4, stop_token_ids=[0])
    for msg in (load, gen):
        assert REQUEST.validate_json(REQUEST.dump_json(msg)) == msg
    out = Generated(outputs=[[5, 0], [6]], seconds=0.5, steps=3, request_steps=4)
    assert REPLY.validate_json(REPLY.dump_json(out)) == out
    assert isinstance(REPLY.validate_json(b'{"kind": "failed", "error": "E: x"}'), Failed)


def test_a_malformed_request_names_the_field():
    with pytest.raises(ValueError, match="max_tokens"):
        REQUEST.validate_json(b'{"kind": "generate", "prompts": [[1]], "max_tokens": 0}')


def test_install_script_help_and_a_wrong_option():
    script = REPO / "scripts" / "install.sh"
    helped = subprocess.run(["bash", str(script), "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "--with-vllm" in helped.stdout and "set -e" not in helped.stdout
    wrong = subprocess.run(["bash", str(script), "--with-vlm"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "unknown option '--with-vlm'" in wrong.stderr
