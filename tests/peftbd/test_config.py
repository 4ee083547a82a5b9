import dataclasses
import functools
import json
import typing
from pathlib import Path

import pytest
import yaml

from peftbd.config import (
    Config, ConfigError, DrafterConfig, apply_override, load_config, preset_names, save_config,
)
from peftbd.config_sections import Placement


def test_presets_load_with_the_papers_values():
    assert {"tiny", "qwen3-0.6b"} <= set(preset_names())
    q = load_config("qwen3-0.6b")
    assert q.model.name_or_path == "Qwen/Qwen3-0.6B"
    assert q.data.source == "allenai/tulu-3-sft-mixture"
    assert (q.data.max_prompt_len, q.data.max_new_tokens) == (512, 256)
    assert (q.data.train_size, q.data.val_size, q.data.test_size) == (50_000, 1_000, 1_000)
    assert (q.peftbd.block_size, q.peftbd.denoise_steps) == (16, 1)
    assert (q.peftbd.lora_r, q.peftbd.lora_alpha, q.peftbd.lora_dropout) == (16, 32, 0.0)
    assert len(q.peftbd.target_modules) == 7
    assert (q.peftbd.mask_ratio_min, q.peftbd.mask_ratio_max, q.peftbd.prefix_gamma) == (0.3, 1.0, 0.9)
    o = q.peftbd.optim
    assert (o.lr, o.warmup_ratio, o.scheduler, o.global_batch_size, o.max_steps) == (2e-4, 0.03, "cosine", 64, 10_000)
    assert q.fastmtp.num_steps == 3 and q.fastmtp.loss_weights == (0.51, 0.31, 0.18)
    m = q.fastmtp.optim
    assert (m.lr, m.warmup_ratio, m.weight_decay, m.global_batch_size, m.max_steps) == (5e-5, 0.05, 0.1, 64, 10_000)
    assert q.model.dtype == "bfloat16"
    t = load_config("tiny")
    assert t.model.name_or_path == "embedded:tiny" and t.model.dtype == "float32"
    assert t.model.device == "cpu"


def test_overrides_apply_and_parse_yaml_values():
    cfg = load_config("tiny", overrides=[
        "peftbd.block_size=4", "fastmtp.loss_weights=[0.5, 0.5]", "fastmtp.num_steps=2", "peftbd.optim.lr=1e-3",
        "training.use_gpu=true", "model.name_or_path=/models/qwen", "model.device=cuda",
    ])  # (tiny's model.device=cpu would imply training.use_gpu=false: cpu_only)
    assert cfg.peftbd.block_size == 4
    assert cfg.fastmtp.loss_weights == (0.5, 0.5)
    assert cfg.peftbd.optim.lr == 1e-3
    assert cfg.training.use_gpu is True
    assert cfg.model.name_or_path == "/models/qwen"
    assert load_config("tiny").peftbd.block_size != 4  # presets are not mutated


def test_int_is_accepted_where_a_float_is_expected():
    assert load_config("tiny", overrides=["peftbd.optim.lr=1"]).peftbd.optim.lr == 1.0


@pytest.mark.parametrize(
    ("override", "fragments"),
    [
        ("peftbd.blok_size=3", ["unknown config key 'peftbd.blok_size'", "peftbd.block_size", "keys under peftbd"]),
        ("drafter.block_size=3", ["config section 'drafter' was renamed to 'peftbd'"]),
        ("nosuch.key=1", ["unknown config key 'nosuch'"]),
        ("peftbd.block_size=abc", ["'peftbd.block_size'", "'abc'", "expected an integer"]),
        ("training.use_gpu=3", ["'training.use_gpu'", "3", "true or false"]),
        ("fastmtp.loss_weights=[a, 1]", ["'fastmtp.loss_weights[0]'", "'a'", "a number"]),
        ("peftbd=3", ["'peftbd' is a section", "peftbd.block_size="]),
        ("peftbd.block_size", ["not of the form a.b=value"]),
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
    (tmp_path / "bad.yaml").write_text("peftbd:\n  block_sise: 3\n")
    with pytest.raises(ConfigError, match="peftbd.block_sise"):
        load_config("tiny", config_file=tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("tiny", config_file=tmp_path / "missing.yaml")


ENUMS = {  # field -> (a bad value, the allowed values the error lists)
    "model.dtype": ("fp8", "'float32', 'bfloat16', 'float16'"),
    "model.attn_implementation": ("flash_attention_2", "'sdpa', 'eager'"),
    "peftbd.block_offsets": ("shifted", "'random', 'aligned'"),
    "peftbd.optim.scheduler": ("linear", "'cosine', 'constant'"),
    "fastmtp.optim.scheduler": ("linear", "'cosine', 'constant'"),
    "peftbd_head.optim.scheduler": ("linear", "'cosine', 'constant'"),
    "peftbd_head.feature_rule": ("two", "'three', 'per_layer'"),
    "peftbd_head.block_masks": ("half", "'block', 'block_minus_one'"),
    "dflash.optim.scheduler": ("linear", "'cosine', 'constant'"),
    "dflash.feature_rule": ("two", "'three', 'per_layer'"),
    "dflash.block_masks": ("half", "'block', 'block_minus_one'"),
    "training.precision": ("fp16", "'fp32', 'bf16'"),
    "training.zero_stage": ("4", "0, 1, 2, 3"),
    "serving.drafter_sync": ("mail", "'ship', 'forward'"),
    "cost_profile.roofline_gpu": ("A100", "'H200', 'H100'"),
    "prompt_lookup.occurrence": ("latest", "'recent', 'earliest'"),
    "generate.backend": ("sglang", "'engine', 'vllm'"),
}


@pytest.mark.parametrize("key", ENUMS)
def test_enum_fields_reject_a_bad_value_naming_the_allowed_ones(key):
    bad, allowed = ENUMS[key]
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides=[f"{key}={bad}"])
    assert str(err.value) == (
        f"config key '{key}': value {yaml.safe_load(bad)!r} is not valid; expected one of: {allowed}")


def test_precision_message_and_zero_stage_values_of_the_wrong_type():
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides=["training.precision=fp8"])
    assert str(err.value) == (
        "config key 'training.precision': value 'fp8' is not valid; expected one of: 'fp32', 'bf16'")
    for item in ("training.zero_stage=true", "training.zero_stage=2.0", "training.zero_stage='2'"):
        with pytest.raises(ConfigError, match="expected one of: 0, 1, 2, 3"):
            load_config("tiny", overrides=[item])


def _field_types(section: type, prefix=""):
    """(dotted key, annotation) of every field of the class tree under `section` (`Config`: its
    core sections and every registered method's, under the method's id)."""
    from peftbd.methods import methods

    hints = {f.name: typing.get_type_hints(section)[f.name] for f in dataclasses.fields(section)}
    if section is Config:
        del hints["sections"]
        hints.update({m.id: m.config for m in methods()})
    for name, tp in hints.items():
        if dataclasses.is_dataclass(tp):
            yield from _field_types(tp, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", tp


def _literal_fields(section: type):
    """(dotted key, allowed values) of every Literal field; a tuple field's as one-item lists."""
    for key, tp in _field_types(section):
        if typing.get_origin(tp) is typing.Literal:
            yield key, typing.get_args(tp)
        elif typing.get_origin(tp) is tuple and typing.get_origin(typing.get_args(tp)[0]) is typing.Literal:
            yield key, [[v] for v in typing.get_args(typing.get_args(tp)[0])]


def test_every_allowed_value_of_every_enum_field_loads():
    fields = dict(_literal_fields(Config))
    lists = {"serving.placements", "cost_profile.dtypes", "decoding.reference_engines"}
    assert set(fields) == set(ENUMS) | lists  # ENUMS covers every enum field
    for key, values in fields.items():
        for value in values:
            cfg = load_config("tiny", overrides=[f"{key}={json.dumps(value)}"])
            got = functools.reduce(getattr, key.split("."), cfg)
            assert got == (tuple(value) if isinstance(value, list) else value)


def test_placements_items_are_checked_and_each_is_a_known_placement():
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides=["serving.placements=[split, nowhere]"])
    assert "'serving.placements[1]': value 'nowhere'" in str(err.value)
    assert "'split-fractional-gpu'" in str(err.value)
    with pytest.raises(ConfigError, match="a list whose items are each one of: 'colocated'"):
        load_config("tiny", overrides=["serving.placements=7"])
    from jobs.placement_options import placement_options

    cfg = load_config("qwen3-0.6b")
    for name in typing.get_args(Placement):
        assert placement_options(name, cfg)[0] in ("colocated", "split")


def test_consumers_derive_their_sets_from_the_config():
    from peftbd.methods import serving_names
    from peftbd.models.loading import DTYPES

    assert serving_names()[:4] == ("ar", "peftbd", "fastmtp", "peftbd_head")  # the registry's
    assert tuple(DTYPES) == ("float32", "bfloat16", "float16")


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_device_pattern_accepts(device):
    assert load_config("tiny", overrides=[f"model.device={device}"]).model.device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:1x", "cuda:x", "CPU", "cpu:0", ""])
def test_device_pattern_rejects(device):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides=[f"model.device={device}"])
    assert str(err.value) == (
        f"config key 'model.device': value {device!r} is not valid; expected auto, cpu, cuda or cuda:N")


@pytest.mark.parametrize(("override", "message"), [
    ("peftbd.block_size=0", "config key 'peftbd.block_size': value 0 is out of range; expected >= 1"),
    ("peftbd.lora_r=0", "'peftbd.lora_r': value 0 is out of range; expected >= 1"),
    ("peftbd.optim.checkpoint_every=0", "'peftbd.optim.checkpoint_every': value 0 is out of range"),
    ("fastmtp.optim.eval_every=-5", "'fastmtp.optim.eval_every': value -5 is out of range; expected >= 1"),
    ("training.num_workers=0", "'training.num_workers': value 0 is out of range; expected >= 1"),
    ("peftbd.mask_ratio_min=-0.1", "'peftbd.mask_ratio_min': value -0.1 is out of range; expected in [0, 1]"),
    ("peftbd.mask_ratio_max=1.5", "'peftbd.mask_ratio_max': value 1.5 is out of range; expected in [0, 1]"),
    ("peftbd.mask_ratio_min=0.8", "config key 'peftbd.mask_ratio_min': value 0.8 exceeds "
     "'peftbd.mask_ratio_max' (0.5); expected mask_ratio_min <= mask_ratio_max"),
    ("peftbd.denoise_steps=17", "'peftbd.denoise_steps': value 17 exceeds 'peftbd.block_size' (16)"),
    ("data.train_size=-1", "'data.train_size': value -1 is out of range; expected >= 0"),
    ("decoding.sweep_repeats=0", "'decoding.sweep_repeats': value 0 is out of range; expected >= 1"),
    # the list: each failed late (inside a Ray worker, retried) or was silently accepted
    ("data.train_size=-5", "config key 'data.train_size': value -5 is out of range; expected >= 0"),
    ("peftbd.block_size=-1", "config key 'peftbd.block_size': value -1 is out of range; expected >= 1"),
    ("generate.num_actors=0", "config key 'generate.num_actors': value 0 is out of range; expected >= 1"),
    ("generate.batch_size=0", "config key 'generate.batch_size': value 0 is out of range; expected >= 1"),
    ("data.max_new_tokens=0", "config key 'data.max_new_tokens': value 0 is out of range; expected >= 1"),
    ("peftbd.optim.max_steps=0", "config key 'peftbd.optim.max_steps': value 0 would publish "
     "an untrained drafter (no optimizer step); set a value that trains, or set "
     "training.allow_untrained=true to publish it untrained on purpose (its manifest then says "
     "untrained)"),
    ("fastmtp.optim.max_steps=0", "config key 'fastmtp.optim.max_steps': value 0 would publish an untrained "
     "drafter"),
    ("peftbd.optim.max_steps=-1", "config key 'peftbd.optim.max_steps': value -1 is out of range; "
     "expected >= 0"),
    # their neighbours: settings under which the steps change nothing
    ("peftbd.optim.lr=0", "config key 'peftbd.optim.lr': value 0.0 would publish an untrained "
     "drafter (every step leaves the weights as they are)"),
    ("fastmtp.optim.lr=0.0", "config key 'fastmtp.optim.lr': value 0.0 would publish an untrained drafter"),
    ("fastmtp.loss_weights=[0, 0, 0]", "config key 'fastmtp.loss_weights': value [0.0, 0.0, 0.0] would publish "
     "an untrained drafter (no step has a loss)"),
    ("fastmtp.loss_weights=[0.5, -0.1, 0.2]", "config key 'fastmtp.loss_weights': value [0.5, -0.1, 0.2] "
     "holds -0.1; expected every entry >= 0"),
    ("training.zero_stage=7", "config key 'training.zero_stage': value 7 is not valid; "
     "expected one of: 0, 1, 2, 3"),
    ("training.precision=fp8", "config key 'training.precision': value 'fp8' is not valid; "
     "expected one of: 'fp32', 'bf16'"),
    ("model.dtype=float13", "config key 'model.dtype': value 'float13' is not valid; "
     "expected one of: 'float32', 'bfloat16', 'float16'"),
    # neighbours
    ("training.max_failures=-2", "config key 'training.max_failures': value -2 is out of range; "
     "expected >= -1"),
    ("peftbd.lora_alpha=0", "config key 'peftbd.lora_alpha': value 0 is out of range; expected >= 1"),
    ("fastmtp.loss_weights=[1.0]", "config key 'fastmtp.loss_weights': value [1.0] has 1 entries; "
     "expected one per 'fastmtp.num_steps' (3)"),
    ("decoding.batch_sizes=[1, 0, 4]", "config key 'decoding.batch_sizes': value [1, 0, 4] holds 0; "
     "expected every entry >= 1"),
    ("decoding.batch_sizes=[]", "config key 'decoding.batch_sizes': value [] must hold at least one "
     "entry and none twice, e.g. [1, 4, 16]"),
    ("decoding.batch_sizes=[4, 4]", "config key 'decoding.batch_sizes': value [4, 4] must hold"),
    ("decoding.batch_sizes=[1, 2.5]", "config key 'decoding.batch_sizes[1]': value 2.5 is not valid; "
     "expected an integer"),
])
def test_ranges_name_key_value_and_range(override, message):
    overrides = [override] + (["peftbd.mask_ratio_max=0.5"] if "0.8" in override else [])
    with pytest.raises(ConfigError) as err:
        load_config("tiny", overrides=overrides)
    assert message in str(err.value)


def test_batch_sizes_are_a_list_override() -> None:
    assert load_config("tiny").decoding.batch_sizes == (1, 16)  # the main job: the ends only
    assert load_config("tiny-full").decoding.batch_sizes == (1, 4, 16)
    assert load_config("tiny", overrides=["decoding.batch_sizes=[1,4,16]"]).decoding.batch_sizes == (1, 4, 16)
    assert load_config("tiny", overrides=["decoding.batch_sizes=[8]"]).decoding.batch_sizes == (8,)


def test_ranges_accept_bounds_and_are_checked_once_at_the_end(tmp_path: Path):
    cfg = load_config("tiny", overrides=[
        "peftbd.mask_ratio_min=0", "peftbd.mask_ratio_max=0", "data.train_size=0",
        "peftbd.block_size=1", "peftbd.optim.checkpoint_every=1",
        "peftbd.denoise_steps=16", "peftbd.block_size=16",  # 16 > 1 on the way is fine
    ])
    assert (cfg.peftbd.mask_ratio_min, cfg.peftbd.denoise_steps, cfg.peftbd.block_size) == (0, 16, 16)
    (tmp_path / "bad.yaml").write_text("training:\n  num_workers: 0\n")
    with pytest.raises(ConfigError, match="'training.num_workers': value 0 is out of range"):
        load_config("tiny", config_file=tmp_path / "bad.yaml")


CONFIGS = Path(__file__).parents[2] / "peftbd" / "configs"


def _keys(tree, prefix=""):
    return {k for name, v in tree.items()
            for k in (_keys(v, f"{prefix}{name}.") if isinstance(v, dict) else {f"{prefix}{name}"})}


@pytest.mark.parametrize("name", ["tiny", "qwen3-0.6b"])
def test_preset_files_are_complete_commented_and_equal_the_presets(name):
    from peftbd.methods import methods

    path = CONFIGS / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    ids = {m.id for m in methods()}
    core = {key for key, _ in _field_types(Config) if key.split(".")[0] not in ids}
    assert _keys({k: v for k, v in data.items() if k not in ids}) == core  # every core knob
    assert _keys({k: v for k, v in data.items() if k in ids}) <= {  # method keys: known ones only
        key for key, _ in _field_types(Config) if key.split(".")[0] in ids}
    assert data["preset"] == name
    header = path.read_text().splitlines()[:4]
    assert all(line.startswith("#") for line in header)  # the header says how to run and copy it
    assert f"python -m jobs.pipeline --config peftbd/configs/{name}.yaml" in "\n".join(header)
    assert "cp peftbd/configs/" in "\n".join(header)
    # --config is applied over the default preset (tiny): a full file replaces all of it
    assert load_config("tiny", config_file=path) == load_config(name) == load_config(name, config_file=path)


def test_a_methods_values_live_beside_its_module_and_the_tiny_preset_names_none():
    """Each method's section comes from its own module's file; the tiny preset sets only the
    core sections, so a method added (or a plugin) needs no preset edit."""
    from peftbd.methods import methods
    from peftbd.presets import PRESETS

    from peftbd.config_merge import build

    assert not {m.id for m in methods()} & set(PRESETS["tiny"])
    cfg = load_config("tiny")
    for m in methods():
        assert set(m.defaults) == {f.name for f in dataclasses.fields(m.config)}, m.id  # complete
        assert getattr(cfg, m.id) == build(m.config, dict(m.defaults), f"{m.id}."), m.id


def test_the_presets_are_the_only_values():
    """No core field has a default: a config is a preset's tree, never a bare `Config()`, and a
    preset (or a method's defaults) without some key does not load."""
    from peftbd.config import build_config
    from peftbd.methods import methods

    with pytest.raises(TypeError, match="missing 11 required"):
        Config()
    sections = {Config, typing.get_type_hints(DrafterConfig)["optim"], *(m.config for m in methods()),
                *(s for s in typing.get_type_hints(Config).values() if dataclasses.is_dataclass(s))}
    assert all(f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
               for s in sections for f in dataclasses.fields(s) if f.name != "sections")
    from peftbd.config_merge import build
    from peftbd.presets import PRESETS

    with pytest.raises(ConfigError, match="config key 'serving.max_batch' is missing"):
        build(Config, {**PRESETS["tiny"], "serving": {k: v for k, v in PRESETS["tiny"]["serving"].items()
                                                      if k != "max_batch"}})
    head = next(m for m in methods() if m.id == "peftbd_head")
    trimmed = {k: v for k, v in head.defaults.items() if k != "block_stride"}
    with pytest.raises(ConfigError, match="config key 'peftbd_head.block_stride' is missing"):
        build(head.config, trimmed, "peftbd_head.")
    assert build_config(PRESETS["tiny"]).peftbd_head.block_stride == head.defaults["block_stride"]


def test_each_fields_rule_is_in_its_annotation():
    """The range, form and distinctness rules sit on the fields they check."""
    from peftbd.config_sections import DISTINCT, DecodingConfig, Range

    hints = typing.get_type_hints(DrafterConfig, include_extras=True)
    assert hints["lora_dropout"].__metadata__ == (Range(0, 1),)
    batch_sizes = typing.get_type_hints(DecodingConfig, include_extras=True)["batch_sizes"]
    assert batch_sizes.__metadata__ == (DISTINCT,)
    assert typing.get_args(typing.get_args(batch_sizes)[0])[0].__metadata__ == (Range(1),)


def test_embedded_tiny_is_importable_from_both_modules():
    from peftbd.config import EMBEDDED_TINY as from_config
    from peftbd.presets import EMBEDDED_TINY as from_presets

    assert from_config == from_presets == load_config("tiny").model.name_or_path == "embedded:tiny"


def test_device_cpu_implies_no_gpu_request_anywhere():
    gpu = load_config("qwen3-0.6b")
    assert gpu.training.use_gpu and gpu.generate.num_gpus_per_actor == 1.0
    assert gpu.decoding.worker_num_gpus == 1.0 and gpu.serving.verifier_num_gpus == 1.0
    cpu = load_config("qwen3-0.6b", overrides=["model.device=cpu"])
    assert cpu.training.use_gpu is False
    assert cpu.generate.num_gpus_per_actor == cpu.decoding.worker_num_gpus == 0.0
    assert cpu.serving.drafter_num_gpus == cpu.serving.verifier_num_gpus == 0.0
    assert gpu.cost_profile.num_gpus == 1.0 and cpu.cost_profile.num_gpus == 0.0
    # what runs is still what the preset says: bf16, its sizes and batch layout
    assert (cpu.model.dtype, cpu.training.precision) == ("bfloat16", "bf16")
    assert cpu.training.micro_batch_size == gpu.training.micro_batch_size
    assert load_config("qwen3-0.6b", overrides=["model.device=cuda:1"]).training.use_gpu


def test_preset_training_step_is_micro_batched_and_its_logits_chunked():
    q = load_config("qwen3-0.6b")
    assert q.training.micro_batch_size == 8 and q.training.logits_chunk_rows == 512
    with pytest.raises(ConfigError, match="'training.logits_chunk_rows': value -1 is out of range"):
        load_config("tiny", overrides=["training.logits_chunk_rows=-1"])
