"""Figure 1: throughput vs mean accepted tokens per round, one point per arm (PNG, Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from peftbd.benchmarking.schema import arm_items  # noqa: E402


def throughput_vs_accepted(results: dict[str, Any], path: str | Path) -> Path:
    """Plot each arm's mean throughput (error bar: std over repeated runs) against its mean
    accepted tokens per round (error bar: std over runs) and save a PNG at `path`."""
    path = Path(path)
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    markers = "osD^vP*X"
    for i, (_, arm) in enumerate(arm_items(results)):
        tps, acc = arm["tokens_per_s"], arm["mean_accepted"]
        ax.errorbar(acc["mean"], tps["mean"], xerr=acc["std"], yerr=tps["std"],
                    fmt=markers[i % len(markers)], capsize=4, label=arm["label"])
    mo = results["measured_on"]
    ax.set_xlabel("mean accepted tokens per round")
    ax.set_ylabel("output tokens / s (batch 1, greedy)")
    ax.set_title(f"Throughput vs accepted length\n{mo['model']} · {mo['hardware']}", fontsize=9)
    ax.margins(x=0.15, y=0.1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path
