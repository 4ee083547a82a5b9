"""A stage job refuses what cannot work before Ray starts, in one line and within seconds: a bad
setting, an --out it cannot write or another live run holds, a source with nothing to read."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray

from jobs.generate import main as generate_main
from jobs.train import main as train_main

REPO = Path(__file__).resolve().parents[2]


def _refusal(argv: list[str], main=generate_main) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert not ray.is_initialized(), "Ray was started before the job refused"
    return str(err.value), time.monotonic() - start


@pytest.mark.parametrize("main", [generate_main, lambda argv: train_main(["--method", "peftbd", *argv])])
def test_an_unwritable_out_is_refused_in_one_line(tmp_path, main):
    (tmp_path / "a-file").touch()
    out = tmp_path / "a-file" / "out"
    message, seconds = _refusal(["--out", str(out)], main)
    assert message == (f"error: cannot write the output {out}: {tmp_path / 'a-file'} is not a "
                       f"directory; choose an --out on writable storage")
    assert seconds < 2


def test_a_bad_setting_is_refused_with_key_value_and_range(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        generate_main(["--set", "generate.num_actors=0", "--out", str(tmp_path / "out")])
    assert err.value.code == 2 and not ray.is_initialized()
    assert capsys.readouterr().err == (
        "error: config key 'generate.num_actors': value 0 is out of range; expected >= 1\n")


def test_an_empty_jsonl_source_is_refused_in_one_line(tiny_world, tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text("")
    message, seconds = _refusal(["--source", str(src), "--out", str(tmp_path / "out")])
    assert message == (f"error: data.source={str(src)!r}: {str(src)!r} is empty (no JSON lines); "
                       f"give TULU-3-schema rows {{id, messages, source}}, one per line")
    assert seconds < 5


def test_an_out_held_by_a_live_run_is_refused_naming_it(tiny_world, tmp_path):
    out = tmp_path / "out"
    code = ("import time; from peftbd.output_lock import output_lock\n"
            f"with output_lock({str(out)!r}):\n    print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        message, seconds = _refusal(["--limit", "8", "--out", str(out)])
    finally:
        holder.kill()
        holder.wait()
    assert message.startswith(f"error: {out} is being written by another run: pid {holder.pid} on host ")
    assert seconds < 5 and not (tmp_path / "out.work").exists()
