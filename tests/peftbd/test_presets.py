"""How presets relate: tiny-full is tiny plus its ablations; a preset extends only a complete one."""

import pytest

from peftbd.config import load_config


def test_tiny_full_is_tiny_plus_the_two_ablations() -> None:
    """The full study's one switch: --preset tiny-full differs from tiny in the ablations, the
    concurrency sweep's extent, the sampled prompts (and its name) alone, so both share the world, the generated data
    and the core drafters' inputs."""
    tiny, full = load_config("tiny").to_dict(), load_config("tiny-full").to_dict()
    differ = {(section, key) for section in tiny for key in (tiny[section] if isinstance(
        tiny[section], dict) else [None]) if (tiny[section].get(key) if key else tiny[section])
        != (full[section].get(key) if key else full[section])}
    assert differ == {("preset", None), ("peftbd", "early_exit_layers"),
                      ("peftbd", "offsets_ablation"), ("decoding", "batch_sizes"),
                      ("decoding", "sweep_variants"), ("decoding", "sampling_prompts")}
    assert (tiny["peftbd"]["early_exit_layers"], tiny["peftbd"]["offsets_ablation"]) == (0, False)
    assert (full["peftbd"]["early_exit_layers"], full["peftbd"]["offsets_ablation"]) == (1, True)


def test_a_preset_extends_only_a_complete_preset() -> None:
    from peftbd.presets import _resolve

    files = {"base": {"a": {"x": 1, "y": 2}, "b": 3}, "child": {"extends": "base", "a": {"y": 5}}}
    assert _resolve(files)["child"] == {"a": {"x": 1, "y": 5}, "b": 3}
    with pytest.raises(ValueError, match="extends 'nope'"):
        _resolve({"child": {"extends": "nope"}})
    with pytest.raises(ValueError, match="not a complete preset"):
        _resolve({**files, "grandchild": {"extends": "child"}})
