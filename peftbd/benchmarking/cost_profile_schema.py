"""`cost_profile.json`'s types: what the cost profile writes (`peftbd.benchmarking.cost_profile`)
and every reader (the benchmark's `cost_at_scale`, the report) reads. Plain dataclasses: the file
is `CostProfile.to_dict()`, and `CostProfile.read` / `from_dict` check a file's shape on the way
in (pydantic), naming the first key that does not fit."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from peftbd.benchmarking.misfit import misfit
from peftbd.benchmarking.roofline import GPU
from peftbd.benchmarking.shape_decode import ShapeDecode

PROFILE_FILE = "cost_profile.json"


@dataclass
class ArmCost:
    """One arm's timed round at one dtype (ms; medians over the repeats, minima beside)."""

    label: str
    method: str
    proposed: int
    kv_len: int
    draft_calls: int
    draft_ms_round: float
    verify_ms_round: float
    draft_over_verify_round: float
    draft_ms_round_min: float
    verify_ms_round_min: float
    same_as: str | None = None  # timed as this arm: the same drafting settings (`cost_key`)


@dataclass
class ArmWork:
    """One arm's round as the hardware sees it (dtype-free: weights and KV counted at bf16)."""

    draft_forwards: int
    draft_gflops: float
    draft_mb: float
    verify_gflops: float
    verify_mb: float
    roofline_draft_ms: float
    roofline_verify_ms: float
    roofline_draft_over_verify: float
    largest_draft_tensor: int


@dataclass
class MaskRowCost:
    """The adapter-on embedding lookup + LM head over one draft chunk (ms, median): peft's
    trainable-token wrappers vs the engine's copy-free `draft_embeddings` / `draft_logits`."""

    peft_wrappers_ms: float
    engine_ms: float


@dataclass
class DtypeProfile:
    dtype: str
    arms: dict[str, ArmCost]
    mask_row: MaskRowCost


@dataclass
class ProfiledArchitecture:
    """The architecture profiled: its name, where its config and weights came from, its size."""

    name: str
    origin: str
    weights: str
    layers: int
    hidden_size: int
    vocab_size: int
    parameters: int  # the backbone's
    draft_parameters: dict[str, int] = field(default_factory=dict)  # per drafting module


@dataclass
class Roofline:
    """The roofline bound of each arm's round on a named GPU (`cost_profile.roofline_gpu`)."""

    gpu: GPU
    arms: dict[str, ArmWork]


@dataclass
class CostProfile:
    """`cost_profile.json`: per dtype, per arm id, a round's draft and verify cost."""

    architecture: ProfiledArchitecture
    device: str
    hardware: str
    threads: int
    kv_len: int
    repeats: int
    block_size: int
    early_exit_layers: int
    mtp_steps: int
    roofline: Roofline
    profiles: dict[str, DtypeProfile] = field(default_factory=dict)
    decode: ShapeDecode | None = None  # measured decoding at the first dtype (`shape_decode`)
    seconds: float = 0.0
    peak_rss_mib: float = 0.0
    peak_gpu_mib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def primary_dtype(self) -> str:
        """The dtype projections use: the profile's first (`cost_profile.dtypes[0]`)."""
        return next(iter(self.profiles))

    @classmethod
    def from_dict(cls, data: Any, where: str = PROFILE_FILE) -> CostProfile:
        """A profile from its JSON form; `where` names it in the error when it does not fit."""
        try:
            return _ADAPTER.validate_python(data)
        except ValidationError as e:
            raise misfit(where, e, "a cost profile",
                         "rerun the cost profile (python -m jobs.cost_profile)") from None

    @classmethod
    def read(cls, path: Path) -> CostProfile:
        return cls.from_dict(json.loads(path.read_text()), str(path))


_ADAPTER = TypeAdapter(CostProfile)
