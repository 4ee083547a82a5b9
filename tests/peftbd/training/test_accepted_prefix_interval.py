"""The offline accepted prefix's per-row values and 95% interval (`peftbd.training.rounds`,
`peftbd.training.evaluate`): each row's (accepted, rounds), the interval over the rows with a
round (`peftbd.intervals.ratio_interval`; it agrees with a bootstrap over rows), and evaluate()
gathering the rows over batches and workers in the val split's order, the same rows in the same
order at every evaluation."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from peftbd.intervals import ratio_interval
from peftbd.training.evaluate import ROWS, evaluate
from peftbd.training.learning_curve import ROW_VALUES
from peftbd.training.rounds import Round, accepted_prefix_ci95, round_sums, row_values

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


def _bootstrap_half_width(rows: list[list[Round]], resamples: int, seed: int) -> float:
    """Half the 2.5-97.5 percentile width of Σa / Σr over rows resampled with replacement."""
    a = np.array([sum(x.accepted for x in row) for row in rows], dtype=float)
    r = np.array([len(row) for row in rows], dtype=float)
    idx = np.random.default_rng(seed).integers(0, len(rows), size=(resamples, len(rows)))
    lo, hi = np.percentile(a[idx].sum(1) / r[idx].sum(1), [2.5, 97.5])
    return (hi - lo) / 2


def test_each_rows_values_the_sums_and_the_interval_over_rows_with_a_round():
    rows = [[Round(4, 1), Round(4, 3)], [], [Round(2, 2)], [Round(3, 0), Round(3, 1)]]
    values = row_values(rows)
    assert values.dtype == torch.long
    assert values.tolist() == [[4, 2], [0, 0], [2, 1], [1, 2]]
    assert {k: float(v) for k, v in round_sums(rows).items()} == {
        "rounds": 5, "round_proposed": 16, "round_accepted": 7}
    assert accepted_prefix_ci95(values) == pytest.approx(ratio_interval([4, 2, 1], [2, 1, 2]))
    assert row_values([]).shape == (0, 2)
    assert accepted_prefix_ci95(row_values([[], []])) is None  # no row with a round


@pytest.mark.parametrize("seed,n,correlated", [(0, 200, False), (1, 400, True)])
def test_the_interval_agrees_with_a_bootstrap_over_rows(seed, n, correlated):
    rows = _rows(seed, n, correlated)
    lo, hi = accepted_prefix_ci95(row_values(rows))
    sums = round_sums(rows)
    assert lo < float(sums["round_accepted"] / sums["rounds"]) < hi
    assert (hi - lo) / 2 == pytest.approx(_bootstrap_half_width(rows, 4000, seed + 100), rel=0.15)


class _RoundsTask:
    """A task whose eval sums are precomputed rounds, one list of rows per batch (a batch is its
    index)."""

    def __init__(self, batches: list[list[list[Round]]]) -> None:
        self.batches = batches

    def eval_sums(self, module: nn.Module, batch: int) -> dict[str, torch.Tensor]:
        rounds = self.batches[batch]
        return {**round_sums(rounds), ROWS: row_values(rounds)}

    def eval_metrics(self, sums: dict[str, torch.Tensor]) -> dict:
        return {"sums": {k: float(v) for k, v in sums.items() if k != ROWS},
                "eval_accepted_prefix_ci95": accepted_prefix_ci95(sums[ROWS])}


def test_evaluate_sums_over_batches_and_keeps_every_rows_values_in_order():
    rows = _rows(3, 90, True)
    batches = [rows[:30], rows[30:75], rows[75:]]
    out = evaluate(_RoundsTask(batches), nn.Linear(1, 1), range(3))  # type: ignore[arg-type]
    assert out["sums"] == {k: float(v) for k, v in round_sums(rows).items()}
    assert out[ROW_VALUES] == row_values(rows).tolist()
    assert out["eval_accepted_prefix_ci95"] == pytest.approx(accepted_prefix_ci95(row_values(rows)))


_TWO_WORKERS = textwrap.dedent('''
    import json, sys
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn
    sys.path.insert(0, {repo!r})
    from peftbd.training.evaluate import ROWS, evaluate, rank_rows
    from peftbd.training.learning_curve import ROW_VALUES
    from peftbd.training.rounds import Round, accepted_prefix_ci95, round_sums, row_values

    ROWS_DATA = [[Round(*x) for x in row] for row in json.loads({rows!r})]
    MICRO, WORLD = 3, 2

    class Task:
        """Per-row values: (accepted, rounds, val row index, evaluation number)."""
        calls = 0

        def eval_sums(self, module, batch):
            rounds = [ROWS_DATA[i] for i in batch]
            index = torch.tensor([[i, Task.calls] for i in batch], dtype=torch.long)
            return {{**round_sums(rounds), ROWS: torch.cat([row_values(rounds), index], 1)}}

        def eval_metrics(self, sums):
            return {{"sums": {{k: float(v) for k, v in sums.items() if k != ROWS}},
                     "ci": accepted_prefix_ci95(sums[ROWS][:, :2])}}

    def worker(rank, port, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{{port}}", rank=rank,
                                world_size=WORLD)
        val = list(range(len(ROWS_DATA)))
        # as the training job: global batches of MICRO x WORLD rows, each rank keeps its own
        # (rank_rows), an empty share dropped
        mine = [rank_rows({{"i": val[s : s + MICRO * WORLD]}}, rank, WORLD)["i"]
                for s in range(0, len(val), MICRO * WORLD)]
        mine = [b for b in mine if b]
        results = []
        for call in range(2):
            Task.calls = call
            results.append(evaluate(Task(), nn.Linear(1, 1), mine))
        if rank == 0:
            with open(out, "w") as f:
                json.dump({{"batches": len(mine), "results": results}}, f)
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.start_processes(worker, args=(int(sys.argv[1]), sys.argv[2]), nprocs=WORLD,
                           start_method="fork")  # the children inherit the imports
''')


def test_two_workers_gather_the_same_rows_in_the_val_order_at_every_evaluation(tmp_path):
    rows = _rows(4, 37, True)  # 6 batches of 6 rows and one of 1 row: rank 1 has no share of it
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
    assert result["batches"] == 7
    first, second = result["results"]
    values = row_values(rows).tolist()
    for call, evaluated in enumerate((first, second)):
        assert evaluated[ROW_VALUES] == [[a, r, i, call] for i, (a, r) in enumerate(values)]
        assert evaluated["sums"] == {k: float(v) for k, v in round_sums(rows).items()}
        assert evaluated["ci"] == pytest.approx(accepted_prefix_ci95(row_values(rows)))
