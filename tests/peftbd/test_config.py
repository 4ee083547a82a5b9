from pathlib import Path

import pytest

from peftbd.config import ConfigError, apply_override, load_config, preset_names, save_config


def test_presets_load_with_the_papers_values():
    assert {"tiny", "qwen3-0.6b"} <= set(preset_names())
    q = load_config("qwen3-0.6b")
    assert q.model.name_or_path == "Qwen/Qwen3-0.6B"
    assert q.data.source == "allenai/tulu-3-sft-mixture"
    assert (q.data.max_prompt_len, q.data.max_new_tokens) == (512, 256)
    assert (q.data.train_size, q.data.val_size, q.data.test_size) == (50_000, 1_000, 1_000)
    assert (q.drafter.block_size, q.drafter.denoise_steps) == (16, 1)
    assert (q.drafter.lora_r, q.drafter.lora_alpha, q.drafter.lora_dropout) == (16, 32, 0.0)
    assert len(q.drafter.target_modules) == 7
    assert (q.drafter.mask_ratio_min, q.drafter.mask_ratio_max, q.drafter.prefix_gamma) == (0.3, 1.0, 0.9)
    o = q.drafter.optim
    assert (o.lr, o.warmup_ratio, o.scheduler, o.global_batch_size, o.max_steps) == (2e-4, 0.03, "cosine", 64, 10_000)
    assert q.mtp.num_steps == 3 and q.mtp.loss_weights == (0.51, 0.31, 0.18)
    m = q.mtp.optim
    assert (m.lr, m.warmup_ratio, m.weight_decay, m.global_batch_size, m.max_steps) == (5e-5, 0.05, 0.1, 64, 10_000)
    assert q.model.dtype == "bfloat16"
    t = load_config("tiny")
    assert t.model.name_or_path == "embedded:tiny" and t.model.dtype == "float32"
    assert t.model.device == "cpu"


def test_overrides_apply_and_parse_yaml_values():
    cfg = load_config("tiny", overrides=[
        "drafter.block_size=4", "mtp.loss_weights=[0.5, 0.5]", "drafter.optim.lr=1e-3",
        "training.use_gpu=true", "model.name_or_path=/models/qwen",
    ])
    assert cfg.drafter.block_size == 4
    assert cfg.mtp.loss_weights == (0.5, 0.5)
    assert cfg.drafter.optim.lr == 1e-3
    assert cfg.training.use_gpu is True
    assert cfg.model.name_or_path == "/models/qwen"
    assert load_config("tiny").drafter.block_size != 4  # presets are not mutated


def test_int_is_accepted_where_a_float_is_expected():
    assert load_config("tiny", overrides=["drafter.optim.lr=1"]).drafter.optim.lr == 1.0


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("drafter.blok_size=3", ["unknown config key 'drafter.blok_size'", "drafter.block_size", "keys under drafter"]),
        ("nosuch.key=1", ["unknown config key 'nosuch'"]),
        ("drafter.block_size=abc", ["'drafter.block_size'", "'abc'", "expected an integer"]),
        ("training.use_gpu=3", ["'training.use_gpu'", "3", "true or false"]),
        ("mtp.loss_weights=[a, 1]", ["'mtp.loss_weights[0]'", "'a'", "a number"]),
        ("drafter=3", ["'drafter' is a section", "drafter.block_size="]),
        ("drafter.block_size", ["not of the form a.b=value"]),
    ],
)
def test_bad_keys_and_types_name_key_value_and_form(override, fragments):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides=[override])
    for fragment in fragments:
        assert fragment in str(err.value)


def test_unknown_preset_lists_the_choices():
    with pytest.raises(ConfigError, match="tiny"):
        load_config("qwen-7b")


def test_yaml_file_round_trips_and_layers_under_overrides(tmp_path: Path):
    cfg = apply_override(load_config("tiny"), "data.seed=7")
    path = tmp_path / "cfg.yaml"
    save_config(cfg, path)
    again = load_config("tiny", config_file=path)
    assert again == cfg
    assert load_config("tiny", config_file=path, overrides=["data.seed=9"]).data.seed == 9
    (tmp_path / "bad.yaml").write_text("drafter:\n  block_sise: 3\n")
    with pytest.raises(ConfigError, match="drafter.block_sise"):
        load_config("tiny", config_file=tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("tiny", config_file=tmp_path / "missing.yaml")
