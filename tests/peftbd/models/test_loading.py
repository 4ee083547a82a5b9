import dataclasses

import pytest
import torch

from peftbd.config import load_config
from peftbd.models.loading import ModelUnavailableError, eos_token_ids, load_tokenizer, load_verifier


def test_tiny_preset_loads_a_qwen3_verifier_and_its_tokenizer(tiny_cfg):
    tok = load_tokenizer(tiny_cfg)
    model = load_verifier(tiny_cfg)
    assert model.config.model_type == "qwen3"
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert tok.mask_token_id is not None and tok.mask_token_id < model.config.vocab_size
    assert tok.convert_tokens_to_ids("<|im_end|>") in eos_token_ids(model, tok)


def test_same_code_path_loads_a_local_directory(tiny_world):
    cfg = load_config("tiny", overrides=[f"model.name_or_path={tiny_world.verifier_dir}"])
    model = load_verifier(cfg)
    ref = load_verifier(load_config("tiny"))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), ref.state_dict().values()))


def test_unreachable_hub_error_says_which_preset_needs_what(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub read the variable at import: without this the lookup waits ~46 s on the hub
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    cfg = load_config("qwen3-0.6b", overrides=["model.name_or_path=peftbd-test/not-a-model"])
    with pytest.raises(ModelUnavailableError) as err:
        load_tokenizer(cfg)
    msg = str(err.value)
    assert "qwen3-0.6b" in msg and "peftbd-test/not-a-model" in msg
    assert "--set model.name_or_path=" in msg and "--preset tiny" in msg


def test_missing_local_directory_is_named(tmp_path):
    cfg = load_config("tiny", overrides=[f"model.name_or_path={tmp_path / 'nope'}"])
    with pytest.raises(ModelUnavailableError, match="local directory"):
        load_verifier(cfg)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_configured_dtype_runs_on_cpu_too(tiny_cfg, dtype):
    """No silent fall-back to float32: what the config says is what runs (and what the manifests
    and the report then state)."""
    cfg = dataclasses.replace(tiny_cfg, model=dataclasses.replace(tiny_cfg.model, dtype=dtype))
    model = load_verifier(cfg)
    assert next(model.parameters()).dtype == getattr(torch, dtype)
    logits = model(torch.tensor([[5, 6, 7, 8]])).logits
    assert logits.dtype == getattr(torch, dtype) and torch.isfinite(logits).all()


def test_random_weights_at_an_architecture_are_the_same_in_every_process(tmp_path):
    """`random:<architecture>`: the architecture's shape, weights seeded by training.seed (so a
    drafter replica and a verifier replica hold the same model), the tiny world's tokenizer."""
    import json

    small = {"model_type": "qwen3", "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 96,
             "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 32, "tie_word_embeddings": True}
    (tmp_path / "config.json").write_text(json.dumps(small))
    cfg = load_config("tiny", overrides=[f"model.name_or_path=random:{tmp_path}"])
    a, b = load_verifier(cfg), load_verifier(cfg)
    assert a.config.vocab_size == 4096 and a.config.num_hidden_layers == 2
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    other = load_verifier(dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, seed=1)))
    assert not torch.equal(a.lm_head.weight, other.lm_head.weight)
    assert len(load_tokenizer(cfg)) == len(load_tokenizer(load_config("tiny")))  # the tiny world's
    with pytest.raises(ModelUnavailableError, match="model.name_or_path="):
        load_verifier(load_config("tiny", overrides=["model.name_or_path=random:acme/none"]))
