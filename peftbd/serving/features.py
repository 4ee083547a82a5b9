"""Verifier features as they cross processes (split serving of the block-diffusion head).

A split head drafter never runs the verifier: per round the verifier replica sends the hidden
states (at the head's `feature_layers`) of the positions its forward added to its cache, and the
ingress hands them to the drafter's next `propose`. `FeatureBlock` carries them as the raw bytes
of the (n, m*d) tensor in the verifier's dtype (no JSON floats): n x m x d x itemsize bytes, e.g.
1536 bytes per position for the tiny preset (m = 2, d = 192, float32).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FeatureBlock:
    """Features of the cache positions `start .. start + rows - 1` of one request.

    `data`: the row-major bytes of the (rows, width) tensor; `dtype`: its torch dtype name
    (`float32`, `bfloat16`, ...); `layers`: the verifier hidden-state indices concatenated into
    each row (width = len(layers) x hidden size).
    """

    data: bytes
    rows: int
    width: int
    dtype: str
    layers: tuple[int, ...]
    start: int

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def end(self) -> int:
        """One past the last position these features cover."""
        return self.start + self.rows

    def covers(self, start: int, end: int) -> bool:
        """Whether these are the features of exactly the positions `start .. end - 1`."""
        return (self.start, self.end) == (start, end)

    @classmethod
    def encode(cls, features: torch.Tensor, layers: tuple[int, ...], start: int) -> FeatureBlock:
        """The block of `features` (1, n, m*d) for the positions from `start` on."""
        if features.dim() != 3 or features.shape[0] != 1:
            raise ValueError(f"features of shape {tuple(features.shape)}; expected (1, n, m*d)")
        flat = features[0].detach().contiguous().cpu()
        return cls(flat.view(torch.uint8).numpy().tobytes(), flat.shape[0], flat.shape[1],
                   str(flat.dtype).removeprefix("torch."), tuple(layers), start)

    def decode(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The features as a (1, rows, width) tensor on `device`."""
        dtype = getattr(torch, self.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"FeatureBlock.dtype={self.dtype!r} is not a torch dtype name")
        flat = torch.frombuffer(bytearray(self.data), dtype=dtype)
        if flat.numel() != self.rows * self.width:
            raise ValueError(f"FeatureBlock holds {flat.numel()} values; rows x width = "
                             f"{self.rows} x {self.width}")
        return flat.view(1, self.rows, self.width).to(device)


def feature_bytes(block: FeatureBlock | None) -> int:
    """Bytes of features a reply carried (0 for none)."""
    return 0 if block is None else block.nbytes
