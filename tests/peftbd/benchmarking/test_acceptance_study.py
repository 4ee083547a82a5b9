"""The acceptance study's variants, intervals and output types (no training here: the job's own
test runs it on a small budget)."""

import pytest

from peftbd.benchmarking.acceptance_study import (
    MIX,
    Cell,
    Study,
    Variant,
    VariantFacts,
    cell,
    variants,
)
from peftbd.benchmarking.replay import RowReplay
from peftbd.config import ConfigError, load_config
from peftbd.intervals import ratio_interval
from peftbd.methods import method


def test_variants_vary_one_factor_each():
    cfg = load_config("tiny")
    found = variants(cfg, [method("peftbd"), method("fastmtp")], depths=[2, 4, 8], budgets=[1, 4])
    assert [v.name for v in found] == ["base", "depth4", "depth8", "budget4x"]
    assert found[0].overrides == ()
    depth8 = dict(o.split("=") for o in found[2].overrides)
    assert depth8 == {"tiny_world.num_layers": "8", "tiny_world.hidden_size": "96",
                      "tiny_world.head_dim": "24", "tiny_world.intermediate_size": "384"}
    assert all(k.startswith("tiny_world.") for k in depth8)  # nothing but the verifier's shape
    budget = dict(o.split("=") for o in found[3].overrides)
    assert budget["peftbd.optim.max_steps"] == str(4 * cfg.peftbd.optim.max_steps)
    assert budget["fastmtp.optim.max_steps"] == str(4 * cfg.fastmtp.optim.max_steps)
    assert not any(k.startswith(("tiny_world.", "head.")) for k in budget)
    with pytest.raises(ConfigError, match="--depths 3"):
        variants(cfg, [], depths=[3], budgets=[])


def _params(layers: int, hidden: int, heads: int, kv: int, head_dim: int, mlp: int) -> int:
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim
    return layers * (attn + 3 * hidden * mlp)


def test_depth_shapes_keep_the_default_non_embedding_parameters_within_ten_percent():
    tw = load_config("tiny").tiny_world
    base = _params(tw.num_layers, tw.hidden_size, tw.num_heads, tw.num_kv_heads, tw.head_dim,
                   tw.intermediate_size)
    for variant in variants(load_config("tiny"), [], depths=[4, 8], budgets=[])[1:]:
        shape = {k.split(".")[1]: int(v) for k, v in (o.split("=") for o in variant.overrides)}
        other = _params(shape["num_layers"], shape["hidden_size"], tw.num_heads, tw.num_kv_heads,
                        shape["head_dim"], shape["intermediate_size"])
        assert abs(other / base - 1) < 0.1, variant.name


def test_a_cell_s_interval_is_the_project_s_ratio_interval_of_its_rows_emitted_tokens():
    """Tokens per round = 1 + accepted / rounds: the interval of each row's emitted tokens
    (accepted + a bonus a round) over its rounds (`peftbd.intervals`), rounded as the cell."""
    accepted, rounds = [1, 3, 0, 5, 2, 2, 4, 1], [4, 5, 3, 6, 4, 5, 6, 3]
    rows = [RowReplay(rounds=r, proposed=4 * r, accepted=a, first_accepted=min(a, r))
            for a, r in zip(accepted, rounds)]
    c = cell("base", "peftbd", MIX, rows)
    expected = ratio_interval([a + r for a, r in zip(accepted, rounds)], rounds)
    assert expected is not None and c.ci95 == pytest.approx(expected, abs=1e-4)
    assert c.ci95[0] <= c.tokens_per_round == round(1 + sum(accepted) / sum(rounds), 4) <= c.ci95[1]
    assert cell("base", "peftbd", MIX, rows * 4).ci95[1] - cell(
        "base", "peftbd", MIX, rows * 4).ci95[0] < c.ci95[1] - c.ci95[0]  # narrows with rows
    alike = [RowReplay(rounds=4, proposed=16, accepted=2, first_accepted=2)] * 3
    assert cell("base", "peftbd", MIX, alike).ci95 == (1.5, 1.5)  # every row alike: no width
    assert cell("base", "peftbd", MIX, alike[:1]).ci95 == (1.5, 1.5)  # one row: no width


def test_cell_counts_tokens_per_round_with_the_bonus_and_position_one():
    rows = [RowReplay(rounds=4, proposed=60, accepted=6, first_accepted=3),
            RowReplay(rounds=6, proposed=90, accepted=4, first_accepted=2)]
    c = cell("base", "peftbd", MIX, rows)
    assert (c.rows, c.rounds, c.tokens_per_round, c.position1) == (2, 10, 2.0, 0.5)


def test_study_round_trips_through_json():
    study = Study([VariantFacts(Variant("depth4", "depth", 4, ("tiny_world.num_layers=4",)), 4, 128,
                                1_400_000, 1200, 0.9, {"train_peftbd": 200})],
                  [Cell("depth4", "peftbd", "recall", 10, 50, 1.5, (1.4, 1.6), 0.3)])
    again = Study.from_json(study.to_json())
    assert again == study
    assert again.get("depth4", "peftbd", "recall") == study.cells[0]
    assert again.get("depth4", "peftbd") is None
