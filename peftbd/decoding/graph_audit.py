"""Which inputs a compiled graph mutates, as inductor records it: CUDA-graph trees replay a graph
only when every input it mutates is a static one (a parameter, or a buffer marked with
`torch._dynamo.mark_static_address`, as the KV pool's are); otherwise they skip it and the
forward runs without CUDA graphs. `GraphAudit` reads the same two records inductor checks
(each graph's `mutated_input_idxs` and `static_input_idxs`), so a CPU run can prove what a GPU
run would do. It wraps inductor's private `_compile_fx_inner` (torch 2.13's) and turns the
compile caches off inside its block (a hit in AOTAutograd's cache skips inductor, and so the
record), so every graph the block compiles is compiled and recorded. On CUDA it also counts what the CUDA-graph trees did: graphs recorded and
replayed, and the graphs inductor skipped (`counters["inductor"]["cudagraph_skips"]`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torch._dynamo.utils import counters
from torch._functorch import config as functorch_config
from torch._inductor import compile_fx, cudagraph_trees
from torch._inductor import config as inductor_config


@dataclass(frozen=True)
class GraphRecord:
    """One compiled graph: the inputs it mutates and those the compiler treats as static."""

    mutated: tuple[int, ...]
    static: tuple[int, ...]

    @property
    def non_static_mutations(self) -> tuple[int, ...]:
        """Mutated inputs that are not static: CUDA-graph trees skip a graph that has any."""
        return tuple(i for i in self.mutated if i not in self.static)


@dataclass
class CudaGraphUse:
    """What the CUDA-graph trees did while `cuda_graph_use` was open (summed over its blocks)."""

    recordings: int = 0
    replays: int = 0
    skips: int = 0  # graphs inductor ran without CUDA graphs (any reason)

    @property
    def fell_back(self) -> bool:
        """A compiled forward ran without CUDA graphs: a graph skipped, or none replayed."""
        return bool(self.skips or not self.replays)


@contextmanager
def cuda_graph_use(into: CudaGraphUse | None = None) -> Iterator[CudaGraphUse]:
    """Count the CUDA-graph trees' recordings, replays and inductor's skips inside the block,
    into `into` (a new one if None); the compile caches stay as they are."""
    found = into if into is not None else CudaGraphUse()
    manager = cudagraph_trees.CUDAGraphTreeManager
    record, execute = manager.record_function, manager.execute_node
    skips = counters["inductor"]["cudagraph_skips"]

    def recorded(self: Any, *args: Any) -> Any:
        found.recordings += 1
        return record(self, *args)

    def replayed(self: Any, *args: Any) -> Any:
        found.replays += 1
        return execute(self, *args)

    manager.record_function, manager.execute_node = recorded, replayed  # type: ignore[method-assign,assignment]
    try:
        yield found
    finally:
        manager.record_function, manager.execute_node = record, execute  # type: ignore[method-assign]
        found.skips += counters["inductor"]["cudagraph_skips"] - skips


@dataclass
class GraphAudit:
    """The records of the graphs compiled while `audit()` was open, and what the CUDA-graph
    trees did meanwhile."""

    graphs: list[GraphRecord] = field(default_factory=list)
    cuda: CudaGraphUse = field(default_factory=CudaGraphUse)

    @property
    def skipped(self) -> list[GraphRecord]:
        """The graphs CUDA-graph trees would skip (a non-static input mutated)."""
        return [g for g in self.graphs if g.non_static_mutations]


@contextmanager
def audit() -> Iterator[GraphAudit]:
    """Record every graph inductor compiles (or loads from its cache) inside the block."""
    found = GraphAudit()
    inner = compile_fx._compile_fx_inner

    def recording(*args: Any, **kwargs: Any) -> Any:
        out = inner(*args, **kwargs)
        found.graphs.append(GraphRecord(tuple(sorted(getattr(out, "mutated_input_idxs", ()))),
                                        tuple(sorted(kwargs.get("static_input_idxs", ())))))
        return out

    compile_fx._compile_fx_inner = recording
    try:
        with (inductor_config.patch(fx_graph_cache=False),
              functorch_config.patch(enable_autograd_cache=False), cuda_graph_use(found.cuda)):
            yield found
    finally:
        compile_fx._compile_fx_inner = inner
