"""A GPU run cannot fall back silently: an arm whose compiled forwards ran without CUDA graphs is
an error with decoding.fast_path=true and a loud line with auto; what counts is the CUDA-graph
trees' own recordings, replays and inductor's skips (no GPU needed to check the accounting)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from torch._inductor import cudagraph_trees

from peftbd.benchmarking.forward_paths import CudaGraphsFellBack, cuda_graph_fallbacks
from peftbd.decoding.graph_audit import CudaGraphUse, cuda_graph_use


@dataclass
class _Arm:
    cuda_graph_replays: int | None
    cuda_graph_skips: int | None


ARMS = {"ar": _Arm(120, 0), "peftbd": _Arm(0, 3), "fastmtp": _Arm(40, 1), "cpu_arm": _Arm(None, None)}


def test_auto_names_every_arm_that_ran_without_cuda_graphs():
    assert cuda_graph_fallbacks(ARMS, "auto") == ["peftbd", "fastmtp"]
    assert cuda_graph_fallbacks({"ar": ARMS["ar"], "cpu_arm": ARMS["cpu_arm"]}, "auto") == []


def test_fast_path_true_makes_a_fallback_an_error_naming_the_arm_and_the_fix():
    with pytest.raises(CudaGraphsFellBack, match=r"peftbd \(0 replays, 3 skips\).*fast_path=false"):
        cuda_graph_fallbacks(ARMS, True)
    assert cuda_graph_fallbacks({"ar": ARMS["ar"]}, True) == []


def test_the_benchmark_schema_reads_a_fallback_the_same_way():
    from peftbd.benchmarking.schema import Arm

    fields = {"cuda_graph_replays": 0, "cuda_graph_skips": 0}
    assert cuda_graph_fallbacks({"never_replayed": _Arm(**fields)}, "auto") == ["never_replayed"]
    assert set(fields) <= set(Arm.model_fields)


def test_cuda_graph_use_counts_what_the_trees_record_and_replay_and_restores_them():
    manager = cudagraph_trees.CUDAGraphTreeManager
    record, execute = manager.record_function, manager.execute_node
    manager.record_function = manager.execute_node = lambda self, *args: None  # type: ignore[method-assign,assignment]
    try:
        use = CudaGraphUse()
        with cuda_graph_use(use):
            manager.record_function(object())  # type: ignore[call-arg]
            for _ in range(3):
                manager.execute_node(object())  # type: ignore[call-arg]
        with cuda_graph_use(use):  # summed over blocks
            manager.execute_node(object())  # type: ignore[call-arg]
        assert (use.recordings, use.replays, use.skips, use.fell_back) == (1, 4, 0, False)
        assert CudaGraphUse(recordings=1).fell_back  # recorded, never replayed
    finally:
        manager.record_function, manager.execute_node = record, execute  # type: ignore[method-assign]
