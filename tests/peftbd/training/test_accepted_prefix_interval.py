"""The offline accepted prefix's 95% interval (`peftbd.training.rounds.ratio_ci95`): the delta
method over summed per-row moments agrees with a brute-force bootstrap over rows, and the moments
are sums, so evaluate() adds them over batches and the all-reduce over workers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from peftbd.training.evaluate import evaluate
from peftbd.training.rounds import (
    ROW_MOMENTS,
    Round,
    accepted_prefix_ci95,
    ratio_ci95,
    round_sums,
)

REPO = Path(__file__).resolve().parents[3]
D = 4


def _rows(seed: int, n: int, correlated: bool) -> list[list[Round]]:
    """`n` rows of replayed rounds: row i has its own acceptance p_i (some rows easy, some hard)
    and r_i rounds (with `correlated`, easy rows take fewer rounds, as accepted rows do); a
    round accepts its leading successes, at most D."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        p = rng.beta(2, 2)
        r = int(rng.integers(1, 8 if correlated and p > 0.6 else 30))
        rounds = []
        for _ in range(r):
            a = 0
            while a < D and rng.random() < p:
                a += 1
            rounds.append(Round(proposed=D, accepted=a))
        rows.append(rounds)
    return rows


def _bootstrap_half_widths(rows: list[list[Round]], resamples: int, seed: int) -> tuple[float, float]:
    """(1.96 x the bootstrap sd, half the 2.5-97.5 percentile width) of Σa / Σr over rows
    resampled with replacement."""
    a = np.array([sum(x.accepted for x in row) for row in rows], dtype=float)
    r = np.array([len(row) for row in rows], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(rows), size=(resamples, len(rows)))
    ratios = a[idx].sum(1) / r[idx].sum(1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return 1.959963984540054 * ratios.std(ddof=1), (hi - lo) / 2


@pytest.mark.parametrize("seed,n,correlated", [(0, 200, False), (1, 400, True), (2, 60, True)])
def test_the_delta_method_interval_agrees_with_a_bootstrap(seed, n, correlated):
    rows = _rows(seed, n, correlated)
    sums = round_sums(rows)
    lo, hi = accepted_prefix_ci95(sums)
    mean = float(sums["round_accepted"] / sums["rounds"])
    assert lo < mean < hi and (lo + hi) / 2 == pytest.approx(mean)
    delta = (hi - lo) / 2
    sd_based, percentile = _bootstrap_half_widths(rows, resamples=4000, seed=seed + 100)
    assert delta == pytest.approx(sd_based, rel=0.15)
    assert delta == pytest.approx(percentile, rel=0.15)


def test_the_moments_are_the_rows_and_an_interval_needs_two_rows():
    rows = [[Round(4, 1), Round(4, 3)], [], [Round(2, 2)]]  # a row without rounds is no row
    sums = round_sums(rows)
    assert {k: float(sums[k]) for k in ("rounds", "round_accepted", *ROW_MOMENTS)} == {
        "rounds": 3, "round_accepted": 6, "rows": 2, "row_accepted_sq": 4 ** 2 + 2 ** 2,
        "row_rounds_sq": 2 ** 2 + 1 ** 2, "row_accepted_rounds": 4 * 2 + 2 * 1}
    # by hand: R = 2, residuals 4 - 2*2 = 0 and 2 - 2*1 = 0: a zero-width interval
    assert accepted_prefix_ci95(sums) == [2.0, 2.0]
    assert ratio_ci95(1, 3, 2, 9, 4, 6) is None  # one row: no spread to estimate
    assert ratio_ci95(5, 0, 0, 0, 0, 0) is None  # no round
    # two rows (a, r) = (3, 1), (1, 2): R = 4/3, residuals 5/3 and -5/3, mean r = 3/2:
    # var = (50/9) / (2 * 1 * 9/4) = 100/81
    lo, hi = ratio_ci95(2, 4, 3, 10, 5, 5)
    assert (lo + hi) / 2 == pytest.approx(4 / 3)
    assert (hi - lo) / 2 == pytest.approx(1.959963984540054 * (100 / 81) ** 0.5)


class _RoundsTask:
    """A task whose eval sums are precomputed rounds, one list of rows per batch (a batch is its
    index): what evaluate() adds up is what the tasks' round_sums give."""

    def __init__(self, batches: list[list[list[Round]]]) -> None:
        self.batches = batches

    def eval_sums(self, module: nn.Module, batch: int) -> dict[str, torch.Tensor]:
        return round_sums(self.batches[batch])

    def eval_metrics(self, sums: dict[str, torch.Tensor]) -> dict:
        return {"sums": {k: float(v) for k, v in sums.items()},
                "eval_accepted_prefix_ci95": accepted_prefix_ci95(sums)}


def test_evaluate_sums_the_moments_over_batches():
    rows = _rows(3, 90, True)
    batches = [rows[:30], rows[30:75], rows[75:]]
    out = evaluate(_RoundsTask(batches), nn.Linear(1, 1), range(3))  # type: ignore[arg-type]
    whole = round_sums(rows)
    assert out["sums"] == {k: float(v) for k, v in whole.items()}
    assert out["eval_accepted_prefix_ci95"] == pytest.approx(accepted_prefix_ci95(whole))


_TWO_WORKERS = textwrap.dedent('''
    import json, os, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn
    sys.path.insert(0, {repo!r})
    from peftbd.training.evaluate import evaluate
    from peftbd.training.rounds import Round, accepted_prefix_ci95, round_sums

    ROWS = [[Round(*x) for x in row] for row in json.loads({rows!r})]

    class Task:
        def eval_sums(self, module, batch):
            return round_sums(batch)
        def eval_metrics(self, sums):
            return {{"sums": {{k: float(v) for k, v in sums.items()}},
                     "ci": accepted_prefix_ci95(sums)}}

    def worker(rank, port, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                                world_size=2)
        mine = ROWS[rank::2]  # evaluate.rank_rows' split
        result = evaluate(Task(), nn.Linear(1, 1), [mine[:5], mine[5:]])
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.start_processes(worker, args=(int(sys.argv[1]), sys.argv[2]), nprocs=2,
                           start_method="fork")  # the children inherit the imports
''')


def test_two_workers_all_reduce_the_moments_to_the_whole_val_sets(tmp_path):
    import socket

    rows = _rows(4, 40, True)
    script = tmp_path / "two_workers.py"
    script.write_text(_TWO_WORKERS.format(
        repo=str(REPO), rows=json.dumps([[(x.proposed, x.accepted) for x in row] for row in rows])))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, str(script), str(port), str(out)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    whole = round_sums(rows)
    assert result["sums"] == {k: float(v) for k, v in whole.items()}
    assert result["ci"] == pytest.approx(accepted_prefix_ci95(whole))
