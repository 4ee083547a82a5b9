"""The report's peer section: the peer run's table when its manifest carries one, nothing else."""

from __future__ import annotations

from peftbd.analysis.peer import PEER_KEY, markdown, section
from peftbd.benchmarking.peer_schema import ArmRun, PeerTable, ShapeRow
from peftbd.decoding import Mismatch
from peftbd.peers.vllm_protocol import NgramSpec


def table() -> PeerTable:
    run = ArmRun(tokens_per_s=100.0, new_tokens=50, seconds=0.5, steps=40, ms_per_step=12.5,
                 forward_ms_per_step=10.0)
    arms = {"ours_ar_b1": run, "vllm_ar_b1": run.model_copy(update={
                "tokens_per_s": 80.0, "forward_ms_per_step": None, "steps": 41, "ms_per_step": 15.6}),
            "ours_ar_b16": run, "vllm_ar_b16": run,
            "ours_prompt_lookup": run.model_copy(update={"tokens_per_step": 1.5}),
            "vllm_ngram": run.model_copy(update={"tokens_per_step": 1.5})}
    row = ShapeRow(shape="tiny", model="embedded:tiny", dtype="float32", path="fast",
                   ours_compiled=True, vllm_compiled=True, prompts=2, max_new_tokens=8, batch_size=16,
                   arms=arms, identical=1, mismatches=[Mismatch("tiny-1", 3, 5, 6, 0.0002)],
                   ngram_identical=2, vllm_load_s=12.0)
    return PeerTable(vllm_version="0.32.0", device="cpu", threads=1, ngram=NgramSpec(num_tokens=8, min_ngram=2, max_ngram=4),
                     rows=[row])


def test_the_section_renders_the_manifest_s_table():
    assert section(None) == [] and section({"wall_s": 1.0}) == []
    title, body = section({PEER_KEY: table().model_dump()})
    assert title == "## vLLM beside us: the peer table" and body == markdown(table())
    assert "| greedy AR, batch 1 | 100.0 | 80.0 | 1.25x |  | 40, 41 | 12.50 (10.00 + 2.50), 15.60 |" in body
    assert "| prompt lookup / ngram, batch 1 | 100.0 | 100.0 | 1.00x | 1.50, 1.50 | 40, 40 |" in body
    assert "AR outputs identical on 1/2 prompts" in body
    assert "**tiny, fast path** (ours compiled, vLLM compiled)" in body
    assert "tiny-1 differs from token 3 (ours 5, vLLM 6; top-2 margin 0.0002)" in body


def test_a_peer_table_from_before_paired_paths_asks_for_a_rerun():
    old = table().model_dump()
    for row in old["rows"]:
        del row["path"]
    title, body = section({PEER_KEY: old})
    assert "rerun `python -m jobs.peer --force`" in body


def test_a_graph_compiled_inside_a_timed_pass_is_said_loudly():
    t = table()
    t.rows[0].compiled_in_timed = 2
    assert "**2 of our graphs compiled inside the timed passes" in markdown(t)
    assert "compiled inside the timed" not in markdown(table())
