"""The embedded tiny world: a corpus, tokenizer and Qwen3-architecture verifier the project builds
itself (no network), deterministic from `TinyWorldConfig`.

- `corpus`: TULU-3-schema conversations from prose shipped with Python, long replies;
- `tokenizer`: a byte-level BPE with Qwen's special tokens, trained locally;
- `verifier`: the tiny Qwen3 config and its brief deterministic causal-LM training;
- `build`: builds all three once into the cache dir (a stage of `peftbd.layout`).
"""
