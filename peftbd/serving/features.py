"""Verifier state as it crosses processes: what a split Verifier ships its Drafter each round so
the drafter needs no forward of its own to catch up (`serving.drafter_sync: ship`).

Per round the verifier replica sends, for the positions its forward added to its cache, what the
request's drafter reads: the hidden states at the block-diffusion head's `feature_layers`, or the
final hidden states (FastMTP: `layers == (-1,)`, transformers' last `hidden_states`) as a
`FeatureBlock`; every layer's keys and values (PEFT-BD, whose draft attends to the verifier's
cache) as a `KVBlock`. The ingress hands them to the drafter's next `propose`. Both carry the raw
bytes of their tensor in the verifier's dtype (no JSON floats), e.g. per position for the tiny
preset: 1536 bytes of head features (m = 2, d = 192, float32), 768 of final hidden states; at
Qwen3-0.6B in bfloat16, 114,688 bytes of KV (28 layers x 2 x 8 heads x 128 x 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FINAL_HIDDEN = (-1,)
"""`FeatureBlock.layers` of the final hidden states (what FastMTP reads as `state.hidden`)."""


@dataclass(frozen=True)
class _Block:
    """Raw tensor bytes of cache positions `start .. start + rows - 1` of one request."""

    data: bytes
    rows: int
    dtype: str  # torch dtype name: float32, bfloat16, ...
    start: int

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def end(self) -> int:
        """One past the last position this block covers."""
        return self.start + self.rows

    def covers(self, start: int, end: int) -> bool:
        """Whether this block holds exactly the positions `start .. end - 1`."""
        return (self.start, self.end) == (start, end)

    def _tensor(self, shape: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{type(self).__name__}.dtype={self.dtype!r} is not a torch dtype name")
        flat = torch.frombuffer(bytearray(self.data), dtype=dtype)
        if flat.numel() != torch.Size(shape).numel():
            raise ValueError(f"{type(self).__name__} holds {flat.numel()} values; its shape "
                             f"{shape} needs {torch.Size(shape).numel()}")
        return flat.view(shape).to(device)


def _bytes(tensor: torch.Tensor) -> tuple[bytes, str]:
    flat = tensor.detach().contiguous().cpu()
    return flat.view(torch.uint8).numpy().tobytes(), str(flat.dtype).removeprefix("torch.")


@dataclass(frozen=True)
class FeatureBlock(_Block):
    """Hidden states of the positions it covers: (rows, width), width = len(layers) x hidden
    size, `layers` the verifier hidden-state indices concatenated into each row."""

    width: int = 0
    layers: tuple[int, ...] = ()

    @classmethod
    def encode(cls, features: torch.Tensor, layers: tuple[int, ...], start: int) -> FeatureBlock:
        """The block of `features` (1, n, m*d) for the positions from `start` on."""
        if features.dim() != 3 or features.shape[0] != 1:
            raise ValueError(f"features of shape {tuple(features.shape)}; expected (1, n, m*d)")
        data, dtype = _bytes(features[0])
        return cls(data, features.shape[1], dtype, start, features.shape[2], tuple(layers))

    def decode(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The features as a (1, rows, width) tensor on `device`."""
        return self._tensor((1, self.rows, self.width), device)


@dataclass(frozen=True)
class KVBlock(_Block):
    """Every layer's keys and values of the positions it covers: (layers, 2, heads, rows, dim)."""

    layers: int = 0
    heads: int = 0
    head_dim: int = 0

    @classmethod
    def encode(cls, kv: list[tuple[torch.Tensor, torch.Tensor]], start: int) -> KVBlock:
        """The block of per-layer (keys, values), each (1, heads, n, head_dim)."""
        stacked = torch.stack([torch.cat([k, v]) for k, v in kv])  # (layers, 2, heads, n, dim)
        data, dtype = _bytes(stacked)
        layers, _, heads, rows, dim = stacked.shape
        return cls(data, rows, dtype, start, layers, heads, dim)

    def decode(self, device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (keys, values), each (1, heads, rows, head_dim) on `device`."""
        t = self._tensor((self.layers, 2, self.heads, self.rows, self.head_dim), device)
        return [(t[i, 0:1], t[i, 1:2]) for i in range(self.layers)]


Shipped = FeatureBlock | KVBlock | None
"""What a verifier reply ships its request's drafter."""


def feature_bytes(block: Shipped) -> int:
    """Bytes of verifier state a reply carried (0 for none)."""
    return 0 if block is None else block.nbytes


def joined(earlier: Shipped, later: Shipped) -> Shipped:
    """One block of two replies' blocks for a drafter that took neither yet (a round drafted
    ahead skipped its propose): `later` extended back over `earlier`'s positions when both are
    of one kind and contiguous, else `later`."""
    if earlier is None or later is None or earlier.end != later.start:
        return later
    if isinstance(earlier, KVBlock) and isinstance(later, KVBlock):
        return KVBlock.encode([(torch.cat([ka, kb], 2), torch.cat([va, vb], 2)) for (ka, va), (kb, vb)
                               in zip(earlier.decode(), later.decode())], earlier.start)
    if isinstance(earlier, FeatureBlock) and isinstance(later, FeatureBlock) \
            and earlier.layers == later.layers:
        return FeatureBlock.encode(torch.cat([earlier.decode(), later.decode()], 1), earlier.layers,
                                   earlier.start)
    return later
