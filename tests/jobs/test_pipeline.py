import pytest

from peftbd.config import load_config


def _main(capfd, *argv: str) -> tuple[int, str, str]:
    """`python -m jobs.pipeline ARGV` in this process: (exit code, stdout, stderr)."""
    from jobs.pipeline import main

    try:
        main(list(argv))
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    out = capfd.readouterr()
    return code, out.out, out.err


def test_help_lists_presets_and_options(capfd):
    code, out, _ = _main(capfd, "--help")
    assert code == 0
    for text in ("tiny", "qwen3-0.6b", "--preset", "--config", "--set", "--out"):
        assert text in out


def test_bad_override_exits_with_the_key_named(capfd):
    code, _, err = _main(capfd, "--set", "peftbd.blok_size=8")
    assert code == 2
    assert "peftbd.blok_size" in err and "peftbd.block_size" in err


def _stand_in_outputs(cfg, root):
    """Every stage's output made through the contract with a stand-in build (no training)."""
    from jobs.pipeline import stage_calls
    from peftbd.stage import run_stage

    for call in stage_calls(cfg, root):
        run_stage(call.inputs(), call.out, lambda tmp, _inputs: {}, call.cfg_dict)


def _reruns(overrides, root, force=(), start=None):
    from jobs.pipeline import forced_stages, plan, stage_calls

    calls = stage_calls(load_config("tiny-full", overrides=overrides), root)
    decisions = plan(calls, forced_stages(list(force), start, calls))
    return {c.spec.name for c, d in zip(calls, decisions) if d.run}


PEFTBD_STAGES = {"train_peftbd", "train_peftbd_early_exit", "train_peftbd_offsets", "benchmark"}
AFTER_WORLD = {"generate", "train_peftbd", "train_peftbd_early_exit", "train_peftbd_offsets", "train_fastmtp",
               "train_peftbd_head", "train_dflash", "benchmark"}


def test_a_changed_value_reruns_the_stages_that_read_it_and_what_follows(tmp_path, monkeypatch):
    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "run"
    _stand_in_outputs(load_config("tiny-full"), root)  # every stage, the ablations' too
    assert _reruns([], root) == set()
    assert _reruns(["peftbd.lora_r=4"], root) == PEFTBD_STAGES
    assert _reruns(["data.max_new_tokens=32"], root) == AFTER_WORLD
    assert _reruns(["decoding.max_new_tokens=32"], root) == {"benchmark"}
    assert _reruns(["fastmtp.optim.lr=1e-3"], root) == {"train_fastmtp", "benchmark"}
    assert _reruns(["peftbd_head.optim.lr=1e-3"], root) == {"train_peftbd_head", "benchmark"}
    assert _reruns(["peftbd_head.layers=2"], root) == {"train_peftbd_head", "cost_profile", "benchmark"}
    assert _reruns(["peftbd_head.draft_vocab=256"], root) == {"benchmark"}  # drafting, not training
    assert _reruns(["dflash.anchors=64"], root) == {"train_dflash", "benchmark"}
    assert _reruns(["dflash.block_masks=block"], root) == {"train_dflash", "cost_profile", "benchmark"}
    assert _reruns(["peftbd.early_exit_layers=2"], root) == {"train_peftbd_early_exit", "benchmark"}
    # the main recipe flips to aligned: both adapters retrain (each the other's ablation)
    assert _reruns(["peftbd.block_offsets=aligned"], root) == PEFTBD_STAGES
    assert _reruns(["peftbd.offsets_ablation=false"], root) == {"cost_profile", "benchmark"}
    assert _reruns(["cost_profile.kv_len=256"], root) == {"cost_profile", "benchmark"}
    assert _reruns(["peftbd.block_size=8"], root) == PEFTBD_STAGES | {"cost_profile"}
    assert _reruns(["peftbd_head.block_size=8"], root) == {"train_peftbd_head", "cost_profile", "benchmark"}
    assert _reruns(["tiny_world.seed=1"], root) == {"world"} | AFTER_WORLD
    assert _reruns(["training.storage_path=/elsewhere", "generate.num_actors=1"], root) == set()
    assert _reruns([], root, force=["generate"]) == AFTER_WORLD
    assert _reruns([], root, start="train_fastmtp") == {"train_fastmtp", "train_peftbd_head", "train_dflash",
                                                    "cost_profile", "benchmark"}


def test_an_output_of_an_older_layout_stops_the_plan_with_the_fix(tmp_path, monkeypatch):
    from peftbd.manifest import write_manifest
    from peftbd.stage import StageError

    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "run"
    _stand_in_outputs(load_config("tiny-full"), root)
    write_manifest(root / "fastmtp", {"stage": "train_fastmtp", "wall_seconds": 3.0})
    with pytest.raises(StageError, match=r"fastmtp was written by an older peftbd.*--force train_fastmtp"):
        _reruns([], root)
    assert _reruns([], root, force=["train_fastmtp"]) == {"train_fastmtp", "benchmark"}


def test_dry_run_prints_the_plan_and_runs_nothing(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "run"
    _stand_in_outputs(load_config("tiny"), root)
    before = (root / "peftbd" / "manifest.json").read_text()
    code, out, err = _main(capfd, "--out", str(root), "--dry-run", "--set", "peftbd.lora_r=4")
    assert code == 0, err[-2000:]
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert "RUN" in lines["train_peftbd"] and "peftbd.lora_r 8 -> 4" in lines["train_peftbd"]
    assert "input train_peftbd reruns" in lines["benchmark"]
    assert "skip" in lines["generate"] and "skip" in lines["train_fastmtp"]
    assert (root / "peftbd" / "manifest.json").read_text() == before
    assert not (root / "manifest.json").exists()


def test_an_empty_source_stops_the_main_job_in_one_line_before_any_stage(tiny_world, tmp_path):
    from jobs.pipeline import main

    (tmp_path / "rows.jsonl").write_text("")
    src = str(tmp_path / "rows.jsonl")
    with pytest.raises(SystemExit) as err:
        main(["--set", f"data.source={src}", "--out", str(tmp_path / "root")])
    assert str(err.value) == (f"error: data.source={src!r}: {src!r} is empty (no JSON lines); give "
                              f"TULU-3-schema rows {{id, messages, source}}, one per line")
    assert not (tmp_path / "root" / "continuations").exists()


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.train_size=0"], "error: config key 'data.train_size': value 0 leaves the main job's "
     "drafters nothing to train on (they would be published untrained); set data.train_size >= 1, "
     "or set training.allow_untrained=true to publish them untrained on purpose (for a "
     "benchmark-only artifact run python -m jobs.generate alone)"),
    (["data.train_size=7"], "error: config key 'data.train_size': value 7 is below one global batch "
     "of peftbd.optim.global_batch_size=8; raise data.train_size or lower "
     "peftbd.optim.global_batch_size"),
    (["data.val_size=1"], "error: config key 'data.val_size': value 1 is below "
     "training.num_workers=2 (each training worker evaluates val rows); set data.val_size >= 2"),
    (["data.test_size=0"], "error: config key 'data.test_size': value 0 leaves the main job's "
     "benchmark no prompt; set data.test_size >= 1 (for a benchmark-only artifact run python -m "
     "jobs.generate alone)"),
])
def test_split_sizes_the_stages_cannot_use_stop_the_main_job_before_any_stage(
        overrides, message, tmp_path):
    from jobs.pipeline import main

    with pytest.raises(SystemExit) as err:
        main([*(a for o in overrides for a in ("--set", o)), "--out", str(tmp_path / "root"),
              "--dry-run"])
    assert str(err.value) == message
    assert not (tmp_path / "root" / "continuations").exists()


def test_no_train_rows_passes_the_main_job_checks_when_asked_for_explicitly():
    from peftbd.main_job_checks import check_main_job

    check_main_job(load_config("tiny", overrides=["data.train_size=0", "training.allow_untrained=true"]))
    check_main_job(load_config("tiny"))
