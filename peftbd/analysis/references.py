"""The report's words on the audit's independent references (results.json `references`)."""

from __future__ import annotations

from peftbd.benchmarking.schema import Reference, Results

NAMES = {"hf_generate": "HF generate", "vllm": "vLLM"}


def describe(ref: Reference) -> str:
    """`vLLM 0.32.0: 8/8 identical`, with each difference and its margin, or why it did not run."""
    name = " ".join(filter(None, [NAMES.get(ref.engine, ref.engine), ref.version]))
    if ref.absent is not None:
        return f"{name}: did not run ({ref.absent})"
    text = f"{name}: {ref.identical}/{ref.checked} identical"
    if ref.mismatches:
        text += " (" + "; ".join(
            f"{m.prompt_id} from token {m.position}, top-2 margin {m.top2_margin:.3g}"
            for m in ref.mismatches) + ")"
    return text


def reference_sentence(results: Results) -> str:
    """One sentence for the report: AR's outputs against each independent engine's."""
    if not results.references:
        return "AR was checked against no independent engine (decoding.reference_engines is empty)."
    return ("AR's greedy outputs against independent engines' (the first prompts, token for token; "
            "no code shared with this engine): " + "; ".join(map(describe, results.references)) + ".")
