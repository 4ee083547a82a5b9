"""A GPU's price of the engine's forwards: an analytic count of each forward (`ForwardCount`: FLOPs
and elements read, as `peftbd.benchmarking.forward_counter` counts a real one) at the roofline
(`peftbd.benchmarking.roofline`, bf16) plus a fixed framework overhead per forward.

Count of one forward of a Qwen3-style decoder over T tokens (Q per row, K keys per row):
- FLOPs: 2 per multiply-add of every linear over the tokens it computes (LoRA: 2·T·r·(in + out)
  per adapted linear), attention 4·H·Q·K·head_dim per row per layer, the LM head over the
  positions whose logits the engine computes;
- elements read: every weight once (norms included; the LM head's V·d whether tied or not), the
  embedding rows looked up, the KV of the committed tokens (2·layers·kv_heads·head_dim per
  token), the activations handed in (a head's verifier features, MTP's hidden states).
Per method, a round's draft phase (`draft_counts`): PEFT-BD = the backbone with LoRA over
[b, D masks] a row; FastMTP = one MTP step (proj + a decoder layer + the shared LM head) per token,
in sequence; the heads (`peftbd_head`, `dflash`) = context KV injection, then their layers over
[b, masks]; AR and prompt lookup: no GPU forward. Logits: a verify's at every position, a packed
prefill's at each row's last. Rows are taken as equally long, each attending to its own KV (a
GPU's varlen attention; the engine's CPU packed prefill is dense over all rows: equal at one row).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from peftbd.benchmarking.forward_counter import ForwardCount
from peftbd.benchmarking.roofline import GPU, GPUS, forward_seconds
from peftbd.models.architecture import QWEN3_0_6B_CONFIG, QWEN3_8B_CONFIG
from peftbd.simulation.shapes import ForwardShape


@dataclass(frozen=True)
class Decoder:
    """The fields of a Qwen3 config the count reads (`of`: from a `Qwen3Config` or a dict)."""

    label: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: Any, label: str = "") -> Decoder:
        def get(key: str) -> Any:
            return config[key] if isinstance(config, dict) else getattr(config, key)

        return cls(label, **{f: int(get(f)) for f in cls.__dataclass_fields__ if f != "label"})

    def kv_per_token(self, layers: int | None = None) -> int:
        """KV elements one token holds in `layers` layers (None: all of them)."""
        return 2 * (layers or self.num_hidden_layers) * self.num_key_value_heads * self.head_dim


ROOFLINE_MODELS: dict[str, Decoder] = {
    "qwen3-0.6b": Decoder.of(QWEN3_0_6B_CONFIG, "Qwen3-0.6B"),
    "qwen3-8b": Decoder.of(QWEN3_8B_CONFIG, "Qwen3-8B"),
}
"""The architectures the simulator prices, by CLI name (`peftbd.models.architecture`'s configs)."""


@dataclass(frozen=True)
class HeadSize:
    """A block-diffusion head: its layers, the verifier feature layers it reads, their MLP width
    (0: the verifier's), whether b is fused with its predecessor's context, draft vocabulary
    (0: all), whether it drafts D - 1 (DFlash's block_minus_one) rather than D."""

    layers: int
    features: int
    intermediate: int = 0
    fusion: bool = True
    vocab: int = 0
    minus_one: bool = False


@dataclass(frozen=True)
class DraftSizes:
    """The drafters' sizes, at the qwen3-0.6b preset's (the paper's) defaults: block D = 16;
    LoRA r16 on all seven projections (`peftbd.target_modules`); FastMTP 3 steps; the head 1
    layer on three features, anchor fused; DFlash 5 layers on 5 features, unfused, D - 1."""

    block_size: int = 16
    lora_rank: int = 16
    mtp_steps: int = 3
    head: HeadSize = field(default_factory=lambda: HeadSize(1, 3))
    dflash: HeadSize = field(default_factory=lambda: HeadSize(5, 5, fusion=False, minus_one=True))


AR, PEFTBD, FASTMTP, HEAD, DFLASH, PROMPT_LOOKUP = "ar", "peftbd", "fastmtp", "peftbd_head", "dflash", \
    "prompt_lookup"
METHODS = (AR, PEFTBD, FASTMTP, HEAD, DFLASH, PROMPT_LOOKUP)
"""The serving names priced (`peftbd.methods.serving_names()`)."""


class _Tally:
    """One forward's count being built."""

    def __init__(self, arch: Decoder, mode: str) -> None:
        self.arch, self.count = arch, ForwardCount(mode)

    def read(self, elements: float) -> None:
        self.count.elements_read += int(elements)

    def linear(self, tokens: int, fan_in: int, fan_out: int, lora: int = 0) -> None:
        self.count.flops += 2 * tokens * fan_in * fan_out
        self.read(fan_in * fan_out)
        if lora:
            self.count.flops += 2 * tokens * lora * (fan_in + fan_out)
            self.read(lora * (fan_in + fan_out))

    def layer(self, rows: int, queries: int, keys: int, intermediate: int = 0, lora: int = 0) -> None:
        """One decoder layer over `queries` tokens of `rows` rows, each row attending `keys`/rows."""
        a, d, mlp = self.arch, self.arch.hidden_size, intermediate or self.arch.intermediate_size
        q, kv = a.num_attention_heads * a.head_dim, a.num_key_value_heads * a.head_dim
        for fan_in, fan_out in ((d, q), (d, kv), (d, kv), (q, d), (d, mlp), (d, mlp), (mlp, d)):
            self.linear(queries, fan_in, fan_out, lora)
        self.read(2 * d + 2 * a.head_dim)  # input/post-attention norms, q/k norms
        self.count.flops += round(4 * a.num_attention_heads * a.head_dim * queries * keys / rows)

    def layers(self, n: int, rows: int, queries: int, keys: int, intermediate: int = 0,
               lora: int = 0) -> None:
        """`n` identical decoder layers (`layer`), counted once and multiplied."""
        flops, read = self.count.flops, self.count.elements_read
        self.layer(rows, queries, keys, intermediate, lora)
        self.count.flops = flops + n * (self.count.flops - flops)
        self.count.elements_read = read + n * (self.count.elements_read - read)

    def logits(self, positions: int, vocab: int = 0) -> None:
        """The final norm and the LM head (or a `vocab`-row draft head) over `positions`."""
        self.read(self.arch.hidden_size)
        self.linear(positions, self.arch.hidden_size, vocab or self.arch.vocab_size)


def backbone(arch: Decoder, mode: str, rows: int, tokens: int, kv_tokens: int, logits: int,
             lora: int = 0) -> ForwardCount:
    """The verifier (`lora`: rank of an adapter on, PEFT-BD) over `tokens` tokens of `rows` rows
    attending `kv_tokens` committed ones, the LM head over `logits` positions."""
    t = _Tally(arch, mode)
    t.read(tokens * arch.hidden_size + (arch.hidden_size if lora else 0))  # rows looked up (+ mask row)
    t.layers(arch.num_hidden_layers, rows, tokens, kv_tokens + tokens, lora=lora)
    t.read(kv_tokens * arch.kv_per_token())
    t.logits(logits)
    return t.count


def _mtp_step(arch: Decoder, rows: int, per_row: int, keys: int, kv_tokens: int) -> ForwardCount:
    """One FastMTP step: `per_row` positions a row attending `keys` in all, logits at the last."""
    t, d, n = _Tally(arch, "draft"), arch.hidden_size, rows * per_row
    t.read(2 * n * d + 2 * d)  # hidden states handed in, embedding rows; hidden/embed norms
    t.linear(n, 2 * d, d)
    t.layer(rows, n, keys)
    t.read(kv_tokens * arch.kv_per_token(1))
    t.logits(rows)
    return t.count


def _head(arch: Decoder, size: HeadSize, rows: int, width: int, kv_tokens: int, fresh: int) -> ForwardCount:
    """A block-diffusion head's round: context KV of `fresh` new positions a row, then its layers
    over [b, `width` masks] a row, logits at the masks."""
    t, d, kv = _Tally(arch, "draft"), arch.hidden_size, arch.num_key_value_heads * arch.head_dim
    n, chunk = rows * fresh, rows * (width + 1)
    t.read(n * size.features * d + d)  # verifier features handed in; context norm
    t.linear(n, size.features * d, d)
    t.count.flops += size.layers * 2 * 2 * n * d * kv  # each layer's k/v projections of the context
    if size.fusion:
        t.read(d)  # anchor norm
        t.linear(rows, 2 * d, d)
    t.read(chunk * d + d)  # embedding rows, mask embedding
    t.layers(size.layers, rows, chunk, kv_tokens + chunk, intermediate=size.intermediate)
    t.read(kv_tokens * arch.kv_per_token(size.layers))
    t.logits(rows * width, size.vocab)
    return t.count


def draft_counts(method: str, arch: Decoder, rows: int, width: int, kv_tokens: int,
                 sizes: DraftSizes = DraftSizes(), fresh: int = 1) -> list[ForwardCount]:
    """One round's draft phase of `method` for `rows` rows asking for `width` tokens each over
    `kv_tokens` committed tokens in all, its forwards in sequence. As the engine runs them, a
    block method computes its whole block (D, DFlash D - 1) and cuts it to `width`; FastMTP runs
    min(width, steps) steps. `fresh`: positions a row committed last round, which FastMTP's first
    step and a head's context take in (the shape does not carry it: 1, a rejected round's)."""
    check_method(method)
    if method in (AR, PROMPT_LOOKUP) or rows == 0 or width <= 0:
        return []
    d = sizes.block_size
    if method == PEFTBD:
        return [backbone(arch, "draft", rows, rows * (d + 1), kv_tokens, rows * d, sizes.lora_rank)]
    if method == FASTMTP:
        return [_mtp_step(arch, rows, fresh, kv_tokens, kv_tokens)] + [
            _mtp_step(arch, rows, 1, kv_tokens + rows * s, kv_tokens)
            for s in range(1, min(width, sizes.mtp_steps))]
    size = sizes.head if method == HEAD else sizes.dflash
    return [_head(arch, size, rows, d - size.minus_one, kv_tokens, fresh)]


def forward_counts(shape: ForwardShape, arch: Decoder,
                   sizes: DraftSizes = DraftSizes()) -> list[ForwardCount]:
    """The forwards `shape` runs: a draft phase's (`draft_counts`), or one verifier forward (a
    verify: logits at every position; a packed prefill: at each row's last, the rows finishing)."""
    check_method(shape.method)
    if shape.kind == "draft":
        return draft_counts(shape.method, arch, shape.rows, shape.width, shape.kv_tokens, sizes)
    if shape.kind == "verify":
        tokens = shape.rows * shape.width
        return [backbone(arch, "verify", shape.rows, tokens, shape.kv_tokens, tokens)]
    return [backbone(arch, "prefill", shape.rows, shape.width, shape.kv_tokens, shape.rows)]


def check_method(method: str) -> None:
    """A ValueError naming the known serving names for any other."""
    if method not in METHODS:
        raise ValueError(f"no roofline cost for method {method!r}; known: {', '.join(METHODS)}")


PAPER_AR_TOKENS_PER_S = 431.36
"""The paper's optimized SGLang greedy AR of Qwen3-0.6B: output tokens/s at concurrency 1, bf16,
TP 1 (`peftbd.analysis.paper`: PAPER_VALUES)."""
PAPER_GPU = "H200"
"""The paper names no GPU: the project's default roofline GPU (`cost_profile.roofline_gpu`)."""
OVERHEAD_KV_TOKENS = 512
"""The KV of the AR step the overhead is derived at: a few-hundred-token prompt plus part of the
paper's 256-token replies."""


def paper_overhead_ms(gpu: GPU | None = None) -> float:
    """The paper's SGLang AR step (1000 / 431.36 ms) minus the roofline of that step (Qwen3-0.6B,
    one row, width 1, `OVERHEAD_KV_TOKENS` of KV) on `gpu` (None: `PAPER_GPU`)."""
    step = backbone(ROOFLINE_MODELS["qwen3-0.6b"], "verify", 1, 1, OVERHEAD_KV_TOKENS, 1)
    return 1e3 / PAPER_AR_TOKENS_PER_S - 1e3 * forward_seconds(step, gpu or GPUS[PAPER_GPU])


DEFAULT_OVERHEAD_MS = paper_overhead_ms()
"""Framework time per forward (launches, scheduling, sampling): 2.058 ms = the paper's SGLang AR
step of Qwen3-0.6B (1000 / 431.36 = 2.318 ms) less that step's H200 roofline (0.261 ms: 1.25 GB
of weights and 512 tokens' KV at 4.8 TB/s)."""
DEFAULT_HOP_MS = 1.0
"""One remote call between two GPU replicas on one node (a Ray Serve handle call): an assumed
round figure, before its payload."""
PCIE5_X16_BYTES_PER_S = 64e9
"""PCIe Gen5 x16, one direction (~64 GB/s): a replica's payload leaves its GPU for host memory and
enters the other's, twice over that link (Ray moves it through host memory, not NVLink)."""


class RooflineCost:
    """`CostModel` of one GPU kind at bf16: the roofline of each forward's analytic count plus
    `overhead_ms` per forward (a draft phase of n forwards pays n); a hop is `hop` ms plus its
    payload over `link_bytes_per_s` twice."""

    def __init__(self, gpu: GPU, model_name: str, config: Any, overhead_ms: float = DEFAULT_OVERHEAD_MS,
                 hop: float = DEFAULT_HOP_MS, link_bytes_per_s: float = PCIE5_X16_BYTES_PER_S,
                 sizes: DraftSizes = DraftSizes()) -> None:
        label = ROOFLINE_MODELS[model_name].label if model_name in ROOFLINE_MODELS else model_name
        self.gpu, self.arch, self.sizes = gpu, Decoder.of(config, label), sizes
        self.overhead_ms, self.hop, self.link_bytes_per_s = overhead_ms, hop, link_bytes_per_s
        why = "paper's SGLang AR step" if overhead_ms == DEFAULT_OVERHEAD_MS else "given"
        self.name = f"roofline: {gpu.name} bf16, {label}, + {overhead_ms:.2f} ms/forward ({why})"
        self._ms: dict[ForwardShape, float] = {}

    def counts(self, shape: ForwardShape) -> list[ForwardCount]:
        """The forwards `shape` runs, counted (`forward_counts`)."""
        return forward_counts(shape, self.arch, self.sizes)

    def forward_ms(self, shape: ForwardShape) -> float:
        if shape not in self._ms:  # a simulation asks for the same shapes again and again
            counts = self.counts(shape)
            self._ms[shape] = sum(1e3 * forward_seconds(c, self.gpu) for c in counts) + self.overhead_ms * len(counts)
        return self._ms[shape]

    def hop_ms(self, payload_bytes: int) -> float:
        return self.hop + 1e3 * 2 * payload_bytes / self.link_bytes_per_s
