"""Like for like: the benchmark times no arm on a slower stack than AR's.

The paper ran FastMTP under CUDA graphs and PEFT-BD without them, and part of its 34 vs 188 tok/s
is that difference. Each arm's decoder says which path every model forward of its round runs on
(`SpeculativeDecoder.forward_paths`: "compiled" or "eager"); a speedup over AR means something
only when all of them run on the path of AR's own step. On CUDA a compiled arm must also have
replayed CUDA graphs (`cuda_graph_fallbacks`). A report says what ran (`path_words`, `ran_words`)
and, loudly, what fell back (`fell_back_line`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from peftbd.errors import UserError

Paths = Mapping[str, Mapping[str, str]]
"""{arm id: {forward ("verify", "draft"): "compiled" | "eager"}}."""


class MixedPaths(UserError, ValueError):
    """Arms whose forwards would be timed on different paths (the message names one and the fix)."""


def check_like_for_like(paths: Paths, reference: str = "ar") -> None:
    """Raise `MixedPaths` unless every forward of every arm runs on the path of the `reference`
    arm's step (its verify)."""
    want = paths[reference]["verify"]
    for arm, forwards in paths.items():
        for forward, path in forwards.items():
            if path != want:
                raise MixedPaths(
                    f"decoding.fast_path: {reference}'s step runs {want} but {arm}'s {forward} "
                    f"runs {path}, so its speedup would compare different stacks; a drafter's "
                    "forwards are compiled only when it runs them through state.path and sets "
                    "draft_on_path = True (docs/adding-a-drafter.md), else set "
                    "decoding.fast_path=false to time every arm eager")


def path_words(paths: Paths) -> str:
    """"every forward eager" when all agree, else each arm's paths (a report's line)."""
    found = {p for forwards in paths.values() for p in forwards.values()}
    if len(found) == 1:
        return f"every forward {found.pop()}"
    return "; ".join(f"{arm}: " + ", ".join(f"{f} {p}" for f, p in forwards.items())
                     for arm, forwards in paths.items())


class RanArm(Protocol):
    """What `ran_words` reads of an arm (`peftbd.benchmarking.cost_profile_schema.ArmRun`)."""

    device: str
    dtype: str
    paths: dict[str, str]


def ran_words(arms: Mapping[str, RanArm]) -> str:
    """"bfloat16 on cuda:0, every forward compiled": the dtypes, devices and paths `arms` ran,
    each said once (`path_words`)."""
    def each(attr: str) -> str:
        return "/".join(dict.fromkeys(getattr(arm, attr) for arm in arms.values()))
    paths = path_words({arm_id: arm.paths for arm_id, arm in arms.items()})
    return f"{each('dtype')} on {each('device')}, {paths}"


class CudaGraphArm(Protocol):
    """What `cuda_graph_fallbacks` reads of an arm (`peftbd.benchmarking.schema.Arm`)."""

    cuda_graph_replays: int | None
    cuda_graph_skips: int | None


class CudaGraphsFellBack(UserError, RuntimeError):
    """decoding.fast_path=true on CUDA, and some arm's compiled forwards ran without CUDA graphs."""


def cuda_graph_fallbacks(arms: Mapping[str, CudaGraphArm], setting: bool | str) -> list[str]:
    """The arms whose compiled forwards ran without CUDA graphs on CUDA (a graph skipped, or none
    replayed): their tok/s are not the fast path's. With `decoding.fast_path` true that is an
    error (`CudaGraphsFellBack`); with auto the caller says it loudly (the report)."""
    fell = [arm_id for arm_id, arm in arms.items()  # graph_audit.CudaGraphUse.fell_back's rule
            if arm.cuda_graph_replays is not None and (arm.cuda_graph_skips or not arm.cuda_graph_replays)]
    if fell and setting is True:
        raise CudaGraphsFellBack(
            "decoding.fast_path=true, but on CUDA these arms ran compiled forwards without CUDA "
            f"graphs: {_graph_counts(arms, fell)}; a skip means a graph mutated an input that is "
            "not static (see peftbd.decoding.graph_audit; scripts/device_check.py names the "
            "inputs), or set decoding.fast_path=false to time every arm eager")
    return fell


def fell_back_line(arms: Mapping[str, CudaGraphArm], measured: str) -> str | None:
    """`decoding.fast_path: auto`'s loud line naming the arms that ran without CUDA graphs on
    CUDA (`cuda_graph_fallbacks`) and what that means for their `measured` (a report's, a
    summary's); None when none did."""
    fell = cuda_graph_fallbacks(arms, "auto")
    if not fell:
        return None
    return (f"CUDA GRAPHS FELL BACK in {_graph_counts(arms, fell)}: those arms' compiled forwards "
            f"ran without CUDA graphs, so their {measured} are not the fast path's "
            "(decoding.fast_path=true makes this an error)")


def _graph_counts(arms: Mapping[str, CudaGraphArm], ids: list[str]) -> str:
    """"peftbd (0 replays, 3 skips), ...": what the CUDA-graph trees did in each arm of `ids`."""
    return ", ".join(f"{a} ({arms[a].cuda_graph_replays} replays, {arms[a].cuda_graph_skips} skips)"
                     for a in ids)
