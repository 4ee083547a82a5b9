"""The peer table's words: peer.md, and the report's section when the peer run sits beside the
benchmark (`python -m peftbd.benchmarking.peer`)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from peftbd.benchmarking.peer_schema import ArmRun, PeerTable

PEER_KEY = "peer"
"""The peer stage's manifest key holding its PeerTable."""


def ratio(a: ArmRun, b: ArmRun) -> float:
    return a.tokens_per_s / b.tokens_per_s


def _count(n: int | None) -> str:
    return "n/a" if n is None else str(n)


def _num(value: float | None) -> str:
    """Two decimals, or n/a (not measured)."""
    return "n/a" if value is None else f"{value:.2f}"


def _step_ms(run: ArmRun) -> str:
    """`1.48 (1.20 + 0.28)`: a step's ms, its forwards' and the rest (host time)."""
    if run.ms_per_step is None:
        return "n/a"
    if run.forward_ms_per_step is None:
        return _num(run.ms_per_step)
    host = run.ms_per_step - run.forward_ms_per_step
    return f"{run.ms_per_step:.2f} ({run.forward_ms_per_step:.2f} + {host:.2f})"


def _ran(compiled: bool) -> str:
    return "compiled" if compiled else "eager"


def markdown(table: PeerTable) -> str:
    """peer.md: one table per shape, ours beside vLLM's, and what the two runs shared."""
    ng = table.ngram
    lines = [
        f"Our engine beside vLLM {table.vllm_version}, one run on {table.hardware or table.device}, one thread each, "
        "greedy, like for like per forward path: fast (our compiled fast path beside vLLM's "
        "compiled graphs) and eager (our eager path beside vLLM's enforce_eager). Each engine is "
        "timed by the host's monotonic clock around the same work in its own process (ours around "
        "each decode, vLLM's from its first request added to its last finished: the pipe between "
        "the two is in neither), after a warm-up pass that compiles every graph. Prompt lookup "
        f"and vLLM's ngram: {ng.num_tokens} tokens a round, n-grams {ng.min_ngram}-{ng.max_ngram}, "
        "the earliest match (vLLM's rule). tok/s: the best of the repeats. An engine step is one "
        "verifier forward over the running requests (a prefill included; vLLM may prefill a "
        "joining request inside a decode step); ours at batch 1 split into its forwards' ms and "
        "the rest (host time).", ""]
    header = ("| arm | ours tok/s | vLLM tok/s | ours / vLLM | tokens per verifier step (ours, vLLM) "
              "| engine steps (ours, vLLM) | ms per step: ours (forward + host), vLLM |")
    for row in table.rows:
        a, B = row.arms, row.batch_size
        lines += [f"**{row.shape}, {row.path} path** (ours {_ran(row.ours_compiled)}, vLLM "
                  f"{_ran(row.vllm_compiled)}): {row.model} in {row.dtype} (both engines), {row.prompts} prompts, up to {row.max_new_tokens} "
                  f"new tokens; AR outputs identical on {row.identical}/{row.prompts} prompts, "
                  f"prompt lookup vs ngram on {row.ngram_identical}/{row.prompts}; vLLM's engine "
                  f"start {row.vllm_load_s:.1f} s.", "", header, "|---|---|---|---|---|---|---|"]
        for label, ours, theirs in (("greedy AR, batch 1", "ours_ar_b1", "vllm_ar_b1"),
                                    (f"greedy AR, batch {B}", f"ours_ar_b{B}", f"vllm_ar_b{B}"),
                                    ("prompt lookup / ngram, batch 1", "ours_prompt_lookup", "vllm_ngram")):
            o, t = a[ours], a[theirs]
            steps = ("" if o.tokens_per_step is None else
                     f"{o.tokens_per_step:.2f}, {_num(t.tokens_per_step)}")
            lines.append(f"| {label} | {o.tokens_per_s:.1f} | {t.tokens_per_s:.1f} | "
                         f"{ratio(o, t):.2f}x | {steps} | {_count(o.steps)}, {_count(t.steps)} "
                         f"| {_step_ms(o)}, {_num(t.ms_per_step)} |")
        if row.compiled_in_timed:
            lines.append(f"- **{row.compiled_in_timed} of our graphs compiled inside the timed "
                         "passes: this path's tok/s include compile time** (the warm-up missed a "
                         "shape; rerun with more `--repeats`, the best is kept)")
        for m in row.mismatches:
            lines.append(f"- AR output of {m.prompt_id} differs from token {m.position} "
                         f"(ours {m.ar_token}, vLLM {m.spec_token}; top-2 margin {m.top2_margin:.3g})")
        lines.append("")
    return "\n".join(lines + _dflash_lines(table))


def _head(counts: list[int], shown: int = 6) -> str:
    return ", ".join(map(str, counts[:shown])) + (", ..." if len(counts) > shown else "")


def _dflash_lines(table: PeerTable) -> list[str]:
    """The DFlash pair's paragraph and table (or why there is none)."""
    pair = table.dflash
    if pair is None:
        return [f"**DFlash in both engines**: not run ({table.dflash_absent or 'no head given'}).", ""]
    interval = "n/a" if pair.ours_interval is None else "{:.2f}-{:.2f}".format(*pair.ours_interval)
    verdict = {True: "inside it", False: "**outside it**", None: "not comparable"}[pair.within]
    o, t = pair.ours, pair.vllm
    return [
        f"**DFlash in both engines** (tiny, batch 1, {pair.path} path): the head trained in {pair.head_dir}, "
        f"exported to vLLM's dflash format in {pair.export_subdir}/ (target layers "
        f"{pair.target_layer_ids}, {pair.num_speculative_tokens} tokens a round). Tokens per "
        f"verifier step: ours {o.tokens_per_step:.2f} (95% interval over the prompts {interval}), "
        f"vLLM's {_num(t.tokens_per_step)}: {verdict}. "
        f"Outputs identical on {pair.identical}/{pair.prompts} prompts. Rounds accepting draft "
        f"position 1, 2, 3, ...: ours {_head(pair.ours_accepted_per_position)}, vLLM's "
        f"{_head(pair.vllm_accepted_per_position)} (vLLM also counts drafts it accepted past the "
        "token budget, in a request's last round).", "",
        "| arm | tok/s | tokens per verifier step | engine steps "
        "| ms per step (ours: verifier forwards + the rest, drafting included) |",
        "|---|---|---|---|---|",
        f"| DFlash, ours | {o.tokens_per_s:.1f} | {o.tokens_per_step:.2f} | {_count(o.steps)} "
        f"| {_step_ms(o)} |",
        f"| DFlash, vLLM | {t.tokens_per_s:.1f} | "
        f"{_num(t.tokens_per_step)} | {_count(t.steps)} "
        f"| {_num(t.ms_per_step)} |",
        f"| ours / vLLM | {ratio(o, t):.2f}x | | | |", ""]


def section(manifest: dict[str, Any] | None) -> list[str]:
    """The report's section: the peer run's table, when its output sits beside this run."""
    if not manifest or PEER_KEY not in manifest:
        return []
    title = "## vLLM beside us: the peer table"
    try:
        table = PeerTable.model_validate(manifest[PEER_KEY])
    except ValidationError:
        return [title, "The peer run beside this one predates like-for-like forward paths: rerun "
                "`python -m jobs.peer --force` for its table."]
    return [title, markdown(table)]
