"""Table 11: acceptance under sampling, from results.json `sampling`
(`peftbd.benchmarking.sampled`): per arm and temperature, accepted tokens per round, position-1
acceptance, tok/s at batch 1, how much of the greedy acceptance survives, and the sample check."""

from __future__ import annotations

from peftbd.analysis.tables import fmt, markdown_table
from peftbd.benchmarking.schema import Results, Sampled, SampledArm

TITLE = "## Table 11 and Figure 5: acceptance under sampling"
LOSSLESS = ("Losslessness at T > 0 is proven by the statistical tests "
            "(`tests/peftbd/decoding/test_sampling.py`: every drafter's output distribution equals "
            "AR sampling's), not by the audit: each drafter uses the draws differently, so its "
            "outputs differ from AR's token for token.")


def sampled(results: Results) -> list[float]:
    """The sampled temperatures (T > 0) of `results` (none when sampling was not measured)."""
    return [t for t in results.sampling.temperatures if t > 0] if results.sampling else []


def intro_words(results: Results) -> str:
    """The report opening's words on sampling: ' (and sampled at T = 1: Table 11)' or ''."""
    temps = ", ".join(f"{t:g}" for t in sampled(results))
    return f" (and sampled at T = {temps}: Table 11)" if temps else ""


def entry(arm: SampledArm, temperature: float) -> Sampled | None:
    """The `sampling.arms.*` arm's entry at `temperature` (None: not measured)."""
    return next((e for e in arm.by_temperature if e.temperature == temperature), None)


def survives(arm: SampledArm, temperature: float) -> float | None:
    """Accepted tokens per round at `temperature` over at T = 0 (None without either)."""
    here, greedy = entry(arm, temperature), entry(arm, 0.0)
    return here.mean_accepted / greedy.mean_accepted if here and greedy else None


def _cells(arm: SampledArm, t: float) -> list[str | None]:
    e = entry(arm, t)
    if e is None:
        return ["skipped" if arm.skipped else None] * (5 if t > 0 else 3)
    rate = e.per_position.rate
    cells = [fmt(e.mean_accepted, 2), fmt(rate[0] if rate else None, 2), fmt(e.tokens_per_s, 1)]
    if t > 0:
        valid = None if e.check is None else f"{e.check.valid}/{e.check.prompts}"
        cells += [fmt(survives(arm, t), 2), valid]
    return cells


def sampling_table(results: Results) -> str:
    """Table 11: per arm, per temperature: tokens / round, position-1 acceptance, tok/s; at T > 0
    also survives (tokens / round over T = 0's) and valid samples; why an arm sits out T > 0."""
    block = results.sampling
    if block is None:
        raise ValueError("sampling_table needs results with a `sampling` block")
    temps = block.temperatures
    header = ["arm"]
    for t in temps:
        header += [f"T={t:g} tokens / round", f"T={t:g} position-1 acceptance", f"T={t:g} tok/s"]
        header += [f"T={t:g} survives", f"T={t:g} valid samples"] if t > 0 else []
    rows = [[block.arms[a].label, *[c for t in temps for c in _cells(block.arms[a], t)],
             block.arms[a].skipped or ""]
            for a, _ in results.arm_items() if a in block.arms]
    return markdown_table([*header, "note"], rows)


def invalid_note(results: Results) -> str | None:
    """A warning naming every arm and temperature with outputs that are no valid sample."""
    arms = results.sampling.arms.values() if results.sampling else []
    bad = [f"{arm.label} at T={e.temperature:g}: {', '.join(e.check.invalid)}"
           for arm in arms for e in arm.by_temperature if e.check and e.check.invalid]
    return f"**Invalid samples** (prompt ids): {'; '.join(bad)}." if bad else None


def section(results: Results, figure: str) -> list[str]:
    """The report's sampling section: how it was measured, Table 11, Figure 5 (`figure`); a note
    without a temperature > 0; nothing when sampling was not measured."""
    block = results.sampling
    if block is None:
        return []
    if not sampled(results):
        return [TITLE, "_No temperature > 0 in this run (decoding.temperatures)._"]
    return [
        TITLE,
        f"At each temperature T > 0 every arm but the synthetic ones (see the note) decodes the "
        f"first {block.prompts} prompts once more at batch 1, each request seeded by decoding.sampling_seed ({block.seed}) and its "
        "prompt's id, top-p 1, top-k 0; T = 0 is the greedy batch-1 pass on the same prompts. "
        "Tokens / round include the bonus (as Table 2); position-1 acceptance = rounds that "
        "accepted draft position 1 / rounds that proposed it; survives = tokens / round at T over "
        "at T = 0; valid samples = outputs within the token budget that end on EOS or at the "
        f"budget. {LOSSLESS}",
        sampling_table(results),
        *filter(None, [invalid_note(results)]),
        f"![Figure 5]({figure})",
    ]
