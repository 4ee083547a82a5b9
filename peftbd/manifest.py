"""Stage artifacts: atomic output directories, manifests, versions, wall time and peak memory."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import platform
import resource
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
PACKAGES = ("torch", "transformers", "peft", "deepspeed", "ray", "pyarrow", "datasets")


def versions() -> dict[str, str]:
    """Python, platform and the versions of the packages that decide the numbers."""
    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def peak_rss_mib() -> float:
    """Peak resident memory of this process (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_gpu_mib() -> float | None:
    """Peak CUDA memory allocated by torch in this process (MiB), or None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


@dataclass(frozen=True)
class WorkerPeaks:
    """Peak memory of the processes that hold a stage's models (generate's actors, the training
    workers, the benchmark's timing workers) and the dtype they ran: the stage manifest's
    `workers` section, beside the driver's own `peak_rss_mib`. None: not measured (no GPU, or
    no worker ran in this run)."""

    workers: int
    peak_rss_mib: float | None
    peak_gpu_mib: float | None
    dtype: str | None = None

    @classmethod
    def here(cls, dtype: str | None = None) -> WorkerPeaks:
        """This process's peaks (called inside a worker)."""
        gpu = peak_gpu_mib()
        return cls(1, round(peak_rss_mib(), 1), None if gpu is None else round(gpu, 1), dtype)

    @classmethod
    def combine(cls, peaks: Sequence[WorkerPeaks]) -> WorkerPeaks:
        """The peaks over several workers (the largest of each), their count and dtypes."""
        def top(values: list[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return max(known) if known else None

        dtypes = sorted({p.dtype for p in peaks if p.dtype})
        return cls(sum(p.workers for p in peaks), top([p.peak_rss_mib for p in peaks]),
                   top([p.peak_gpu_mib for p in peaks]), ", ".join(dtypes) or None)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class StageTimer:
    """Measures a stage's wall time and peak memory for its manifest."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def stats(self) -> dict[str, Any]:
        return {
            "wall_seconds": round(time.perf_counter() - self.start, 2),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "peak_gpu_mib": peak_gpu_mib(),
        }


def is_complete(out_dir: str | Path) -> bool:
    """True when `out_dir` holds a finished artifact (its manifest is written last)."""
    return (Path(out_dir) / MANIFEST).is_file()


def read_manifest(out_dir: str | Path) -> dict[str, Any]:
    """The manifest of a finished artifact."""
    return json.loads((Path(out_dir) / MANIFEST).read_text())


def write_manifest(out_dir: str | Path, manifest: dict[str, Any]) -> Path:
    """Write `manifest.json` atomically (temp file + rename)."""
    path = Path(out_dir) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=2, default=str))
    tmp.replace(path)
    return path


@contextlib.contextmanager
def atomic_output_dir(final: str | Path) -> Iterator[Path]:
    """Yield a `.partial` sibling to write into; on success it replaces `final`, on error it is
    left for inspection and `final` is untouched."""
    final = Path(final)
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
