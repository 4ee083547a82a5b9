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


PAPER_PEFTBD, PAPER_FASTMTP, PAPER_AR = "peftbd", "fastmtp", "ar"
PAPER_PEFTBD_2STEP, PAPER_PEFTBD_ANCHORED = "peftbd_2step", "peftbd_anchored"
"""The paper's arms as PAPER_VALUES keys them: PEFT-BD (D = 16, one step, unanchored), its
two-step and anchored ablations, FastMTP and greedy AR. They are the paper's, kept as quoted (not
taken from `peftbd.methods`); each also names the arm of ours that reproduces it, which is how
the paper table and the findings set ours beside it (tests/peftbd/methods/test_method_names.py
checks that each still names one of our arms)."""


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

    @property
    def number(self) -> float:
        """`value`, for a number the paper states as one (a ValueError for one it quotes only as
        text, e.g. a range)."""
        if self.value is None:
            raise ValueError(f"the paper quotes {self.metric} of {self.arm} only as {self.text!r}")
        return self.value


PAPER_VALUES: tuple[PaperValue, ...] = (
    PaperValue("tokens_per_s", PAPER_PEFTBD, 34.05, SGLANG, std=0.20),
    PaperValue("mean_accepted", PAPER_PEFTBD, 2.881, SGLANG),
    PaperValue("tokens_per_s", PAPER_FASTMTP, 188.01, SGLANG, std=9.79),
    PaperValue("mean_accepted", PAPER_FASTMTP, 1.511, SGLANG),
    PaperValue("tokens_per_s", PAPER_AR, 431.36, SGLANG, std=4.25),
    PaperValue("tokens_per_s", PAPER_PEFTBD_2STEP, 7.29, SGLANG),
    PaperValue("mean_accepted", PAPER_PEFTBD_2STEP, 1.021, SGLANG),
    PaperValue("mean_accepted", PAPER_PEFTBD, 2.826, HF_LOOP),
    PaperValue("mean_accepted", PAPER_PEFTBD_ANCHORED, 3.046, HF_LOOP),
    PaperValue("tokens_per_s", PAPER_PEFTBD_ANCHORED, None, HF_LOOP, text="15.4-15.6 (both arms)"),
    PaperValue("draft_calls", PAPER_PEFTBD, 1769, PROFILE),
    PaperValue("verify_calls", PAPER_PEFTBD, 1769, PROFILE),
    PaperValue("draft_mean_ms", PAPER_PEFTBD, 50.285, PROFILE),
    PaperValue("verify_mean_ms", PAPER_PEFTBD, 50.621, PROFILE),
    PaperValue("t0_s", PAPER_PEFTBD, 0.0846, ORACLE),
    PaperValue("draft_share", PAPER_PEFTBD, 0.498, ORACLE),
    PaperValue("free_draft_tokens_per_s", PAPER_PEFTBD, 67.865, ORACLE),
    PaperValue("needed_accepted_vs_fastmtp", PAPER_PEFTBD, 8.0, ORACLE, text="about 8"),
    PaperValue("needed_accepted_vs_ar", PAPER_PEFTBD, 18.312, ORACLE),
)
"""Every paper number the report quotes; the paper gives no per-arm token/block acceptance."""


def paper_value(metric: str, arm: str, measured_on: str = SGLANG) -> PaperValue:
    """The paper's `metric` of `arm` as measured on `measured_on` (a key of SETUPS)."""
    for pv in PAPER_VALUES:
        if (pv.metric, pv.arm, pv.measured_on) == (metric, arm, measured_on):
            return pv
    raise KeyError(f"the paper quotes no {metric} of {arm} on {measured_on}")
