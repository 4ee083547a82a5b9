"""The PEFT-BD paper's reported numbers, each labelled with what it was measured on.

These are the only numbers in the report that do not come from this project's artifacts: they are
quoted from `../shared/reference/peft-bd-paper.txt` (sections 5 and 8) so the report can set ours
beside them. `ours` in each row says where the matching value sits in `results.json`.
"""

from __future__ import annotations

from dataclasses import dataclass

SGLANG, HF_LOOP, PROFILE, ORACLE = "SGLang", "HF loop", "HF profile", "oracle"
SETUPS: dict[str, str] = {
    SGLANG: "Qwen3-0.6B, bf16, native SGLang (TP 1, concurrency 1), GPU; 1k held-out TULU-3 "
            "prompts, 256 new tokens, 3 repeated runs",
    HF_LOOP: "Qwen3-0.6B, bf16, the paper's local HuggingFace verifier loop, GPU",
    PROFILE: "Qwen3-0.6B, bf16, HuggingFace profiling run: 20 prompts, 256 new tokens, D=16, GPU",
    ORACLE: "the paper's cost model over its SGLang PEFT-BD run (T0 and draft share measured)",
}
"""What each group of the paper's numbers was measured on (the paper does not name its GPU)."""

PAPER_BLOCK_SIZE = 16
"""The paper's PEFT-BD block size D (§3, §8.2)."""

METRICS: dict[str, str] = {
    "tokens_per_s": "output tokens/s",
    "mean_accepted": "accepted tokens / round",
    "draft_calls": "draft forward calls",
    "verify_calls": "verify forward calls",
    "draft_mean_ms": "mean draft forward ms",
    "verify_mean_ms": "mean verify forward ms",
    "t0_s": "T0 (s / round)",
    "draft_share": "draft cost share",
    "free_draft_tokens_per_s": "oracle tokens/s at free drafting (r=1)",
    "needed_accepted_vs_fastmtp": "accepted / round needed to match FastMTP",
    "needed_accepted_vs_ar": "accepted / round needed to match AR",
}
"""Readable names of the metrics in PAPER_VALUES."""


@dataclass(frozen=True)
class PaperValue:
    """One reported number: `value` (and `std` where given, `text` where only a range is given),
    the arm and metric (a key of METRICS) it belongs to, and its setup (a key of SETUPS)."""

    metric: str
    arm: str
    value: float | None
    measured_on: str
    std: float | None = None
    text: str | None = None

    @property
    def quoted(self) -> str:
        """The value as the paper gives it: its text, else value (± std)."""
        if self.text:
            return self.text
        return f"{self.value:g} ± {self.std:g}" if self.std is not None else f"{self.value:g}"


PAPER_VALUES: tuple[PaperValue, ...] = (
    PaperValue("tokens_per_s", "peftbd", 34.05, SGLANG, std=0.20),
    PaperValue("mean_accepted", "peftbd", 2.881, SGLANG),
    PaperValue("tokens_per_s", "fastmtp", 188.01, SGLANG, std=9.79),
    PaperValue("mean_accepted", "fastmtp", 1.511, SGLANG),
    PaperValue("tokens_per_s", "ar", 431.36, SGLANG, std=4.25),
    PaperValue("tokens_per_s", "peftbd_2step", 7.29, SGLANG),
    PaperValue("mean_accepted", "peftbd_2step", 1.021, SGLANG),
    PaperValue("mean_accepted", "peftbd", 2.826, HF_LOOP),
    PaperValue("mean_accepted", "peftbd_anchored", 3.046, HF_LOOP),
    PaperValue("tokens_per_s", "peftbd_anchored", None, HF_LOOP, text="15.4-15.6 (both arms)"),
    PaperValue("draft_calls", "peftbd", 1769, PROFILE),
    PaperValue("verify_calls", "peftbd", 1769, PROFILE),
    PaperValue("draft_mean_ms", "peftbd", 50.285, PROFILE),
    PaperValue("verify_mean_ms", "peftbd", 50.621, PROFILE),
    PaperValue("t0_s", "peftbd", 0.0846, ORACLE),
    PaperValue("draft_share", "peftbd", 0.498, ORACLE),
    PaperValue("free_draft_tokens_per_s", "peftbd", 67.865, ORACLE),
    PaperValue("needed_accepted_vs_fastmtp", "peftbd", 8.0, ORACLE, text="about 8"),
    PaperValue("needed_accepted_vs_ar", "peftbd", 18.312, ORACLE),
)
"""Every paper number the report quotes; the paper gives no per-arm token/block acceptance."""


def paper_value(metric: str, arm: str, measured_on: str = SGLANG) -> PaperValue:
    """The paper's `metric` of `arm` as measured on `measured_on` (a key of SETUPS)."""
    for pv in PAPER_VALUES:
        if (pv.metric, pv.arm, pv.measured_on) == (metric, arm, measured_on):
            return pv
    raise KeyError(f"the paper quotes no {metric} of {arm} on {measured_on}")
