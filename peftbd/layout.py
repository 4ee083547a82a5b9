"""The main job's output layout: one subdirectory per stage under the output root
(`<paths.out_dir>/<preset>` by default), in the order the stages run. The pipeline, the stage
jobs' defaults and the report's stage table all read it from here."""

from __future__ import annotations

WORLD = "world"
CONTINUATIONS = "continuations"
ADAPTER = "peftbd_adapter"
EARLY_EXIT = "peftbd_early_exit"
MTP_HEAD = "mtp_head"
BENCHMARK = "benchmark"

STAGE_NAMES: dict[str, str] = {
    WORLD: "tiny world",
    CONTINUATIONS: "generate continuations",
    ADAPTER: "train PEFT-BD adapter",
    EARLY_EXIT: "train early-exit PEFT-BD adapter",
    MTP_HEAD: "train FastMTP head",
    BENCHMARK: "benchmark + report",
}
"""{stage subdirectory: stage name}, in run order."""
