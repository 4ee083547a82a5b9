"""The simulated placement section from hand-made rows: the validation's interval and error
arithmetic (and its flag under 3 repeats), where split first beats colocated (or never), the
capacities, the deciding term, the first screen (cost models keyed once, one verdict table),
the SIMULATED labels, placement_sim.json, the figure and the section beside a placement output."""

from __future__ import annotations

import itertools
import math

import pytest

from peftbd.analysis.placement import Devices, LoadRow
from peftbd.analysis.placement_sim import (
    SimReport,
    SimulatedRun,
    compare,
    sim_verdicts,
    t_interval,
    validate,
)
from peftbd.analysis.placement_sim_report import sim_figure, sim_markdown
from peftbd.analysis.placement_sim_summary import (
    DETAILS,
    HEADING,
    beside_lines,
    overall_line,
    sim_summary,
    verdict_cell,
)
from peftbd.analysis.placement_verdict import Capacity

DEVICES = {"colocated": Devices(2, 2), "split": Devices(2, 1), "split-ahead": Devices(2, 1)}
COST = "roofline-h100-v1"


def _row(placement: str, clients: int, per_device: float | None, *, p50: float = 100.0,
         busy: dict[str, float | None] | None = None, client_tps: float = 50.0,
         method: str = "peftbd") -> LoadRow:
    return LoadRow(placement=placement, method=method, concurrency=clients, requests=clients,
                   requests_per_s=None, tokens_per_s=None, tokens_per_s_per_device=per_device,
                   client_tokens_per_s=client_tps, p50_ms=p50, p95_ms=p50,
                   transport_ms_per_token=None, mean_batch=None, busy=busy or {})


def test_the_t_interval_is_the_mean_plus_minus_t_times_the_standard_error():
    low, high = t_interval([10.0, 12.0, 14.0])  # mean 12, sd 2, t(0.975, 2 df) = 4.3027
    assert (low + high) / 2 == pytest.approx(12.0)
    assert (high - low) / 2 == pytest.approx(4.3027 * 2 / math.sqrt(3))
    assert t_interval([10.0, 12.0]) is None  # under 3 repeats: no interval


def test_validation_sets_each_metric_beside_the_measured_mean_and_flags_few_repeats():
    repeats = [[_row("split", 4, tps, p50=p50, busy={"drafter": d, "verifier": 0.8}),
                _row("split", 16, 20.0)] for tps, p50, d in ((10, 90, 0.4), (12, 100, 0.5),
                                                             (14, 110, 0.6))]
    repeats[2] = repeats[2][:1]  # the 16-client level measured twice only
    simulated = [_row("split", 4, 13.5, p50=130.0, busy={"drafter": 0.5, "verifier": None}),
                 _row("split", 16, 30.0), _row("colocated", 4, 9.0)]  # colocated: never measured
    rows = {(r.concurrency, r.metric): r for r in validate(repeats, simulated)}
    assert set(rows) == {(4, "tok/s per device"), (4, "p50 ms"), (4, "busy drafter"),
                         (4, "busy verifier"), (16, "tok/s per device"), (16, "p50 ms")}
    tps = rows[4, "tok/s per device"]
    assert (tps.repeats, tps.measured, tps.simulated) == (3, 12.0, 13.5)
    assert tps.interval == pytest.approx(t_interval([10.0, 12.0, 14.0]))
    assert tps.error == pytest.approx(0.125) and tps.within and not tps.flagged
    assert rows[4, "p50 ms"].error == pytest.approx(0.3) and not rows[4, "p50 ms"].within
    assert rows[4, "busy drafter"].error == pytest.approx(0.0)
    verifier = rows[4, "busy verifier"]  # measured, but not simulated: no error, not within
    assert verifier.simulated is None and verifier.error is None and not verifier.within
    few = rows[16, "tok/s per device"]
    assert few.repeats == 2 and few.interval is None and few.flagged
    assert few.error == pytest.approx(0.5)
    strict = {(r.concurrency, r.metric): r for r in validate(repeats, simulated, tolerance=0.1)}
    assert not strict[4, "tok/s per device"].within

    line = overall_line(list(rows.values()), COST)
    assert f"SIMULATED ({COST}) within 15% of measured at 0 of 2 levels" in line
    assert "worst: tok/s per device at split/peftbd/16 clients, +50%" in line


def _run(split_tps: tuple[float, ...], split_busy: dict[str, float | None],
         client_tps: tuple[float, ...] = (90, 80, 60, 50), ahead: bool = False) -> SimulatedRun:
    levels = (1, 4, 16, 64)
    rows = [_row("colocated", c, t, busy={"engine": 0.9}, client_tps=ct)
            for c, t, ct in zip(levels, (50, 80, 100, 110), (100, 80, 40, 20))]
    rows += [_row("split", c, t, busy=split_busy, client_tps=ct)
             for c, t, ct in zip(levels, split_tps, client_tps)]
    rows += [_row("colocated", 1, 40.0, method="ar"), _row("split", 1, 20.0, method="ar")]
    if ahead:
        rows += [_row("split-ahead", c, t, p50=p, busy=split_busy)
                 for c, t, p in ((1, 29.0, 80.0), (4, 68.0, 100.0), (16, 104.0, 100.0))]
    return SimulatedRun("H100", "Qwen3-8B", COST, rows, DEVICES)


def test_split_beats_colocated_from_the_first_level_its_tok_s_per_device_is_higher():
    [v] = sim_verdicts(_run((30, 70, 105, 130), {"drafter": 0.8, "verifier": 0.95}), 0.5)
    assert (v.method, v.split.placement, v.split.levels) == ("peftbd", "split", [1, 4, 16, 64])
    assert v.split.beats_at == 16 and v.split.ratio_at == pytest.approx(1.05)
    assert (v.split.best_ratio, v.split.best_at) == (pytest.approx(130 / 110), 64)
    assert v.ahead is None  # split-ahead not simulated
    # colocated keeps half its one-client tok/s up to 4 clients, on 2 verifier devices; split
    # keeps it at every level (a lower bound), on 1
    assert v.capacity == (Capacity(4, censored=False), Capacity(64, censored=True))
    assert v.capacity_per_verifier == (2.0, 64.0)
    # read at 16 clients: busy 0.875 split vs 0.9 colocated, so split's tokens per busy
    # device-second (105 / 0.875 vs 100 / 0.9) decide it
    assert v.level == 16 and v.utilization == pytest.approx(0.875 / 0.9)
    assert v.efficiency == pytest.approx((105 / 0.875) / (100 / 0.9))
    assert v.term == "efficiency"


def test_split_that_never_beats_colocated_is_decided_by_its_idle_drafter():
    [v] = sim_verdicts(_run((30, 60, 90, 100), {"drafter": 0.3, "verifier": 0.95}), 0.5)
    assert v.split.beats_at is None and v.split.ratio_at is None
    assert (v.split.best_ratio, v.split.best_at) == (pytest.approx(100 / 110), 64)
    assert v.level == 64  # the highest level
    assert v.term == "utilization" and v.idle_role == "drafter"
    assert v.busy_ratio == pytest.approx(0.3 / 0.95)
    assert v.utilization == pytest.approx((0.3 + 0.95) / 2 / 0.9)
    assert "drafter" in v.deciding and "70%" in v.deciding  # the drafter's idle share


def test_an_idle_verifier_is_named_and_missing_busy_fractions_decide_nothing():
    [v] = sim_verdicts(_run((30, 60, 90, 100), {"drafter": 0.95, "verifier": 0.2}), 0.5)
    assert v.term == "utilization" and v.idle_role == "verifier"
    [none] = sim_verdicts(_run((30, 60, 90, 100), {}), 0.5)
    assert none.term is None and none.utilization is None and none.idle_role is None


def test_drafting_ahead_is_compared_against_split():
    [v] = sim_verdicts(_run((30, 70, 105, 130), {"drafter": 0.9, "verifier": 0.95},
                            ahead=True), 0.5)
    assert v.ahead is not None and (v.ahead.placement, v.ahead.baseline) == ("split-ahead", "split")
    assert v.ahead.levels == [1, 4, 16] and v.ahead.beats_at is None
    assert (v.ahead.best_ratio, v.ahead.best_at) == (pytest.approx(104 / 105), 16)
    assert v.ahead.p50_ms == (100.0, 80.0)
    assert compare(_run((1,), {}).rows, "peftbd", "colocated", "split-ahead").levels == []


def test_no_verdict_without_colocated():
    run = _run((30, 70, 105, 130), {})
    alone = SimulatedRun("H200", "Qwen3-8B", COST,
                         [r for r in run.rows if r.placement != "colocated"], DEVICES)
    assert sim_verdicts(alone, 0.5) == []


def _section() -> tuple[list[str], SimReport]:
    h100 = _run((30, 70, 105, 130), {"drafter": 0.9, "verifier": 0.95}, ahead=True)
    here = SimulatedRun("this box", "Qwen3-0.6B", "box-fit-v2",
                        [_row("split", 4, 13.5, busy={"drafter": 0.5})], DEVICES)
    repeats = [[_row("split", 4, tps, busy={"drafter": 0.5})] for tps in (10.0, 12.0)]
    validation = validate(repeats, here.rows)
    verdicts = sim_verdicts(h100, 0.5) + sim_verdicts(here, 0.5)
    report = SimReport(runs=[here, h100], validation=validation, verdicts=verdicts)
    return sim_markdown(report.runs, report.validation, report.verdicts), report


def _cells(lines: list[str]) -> list[list[str]]:
    """The first table's rows (after its header and rule), split into cells."""
    flat = "\n".join(lines).splitlines()
    start = next(i for i, line in enumerate(flat) if line.startswith("| "))
    table = list(itertools.takewhile(lambda line: line.startswith("|"), flat[start:]))
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in table[2:]]


def test_the_first_screen_keys_the_cost_models_and_answers_in_one_table():
    lines, report = _section()
    text = "\n".join(lines)
    screen = text[:text.index(DETAILS)].rstrip("\n").splitlines()
    assert len(screen) <= 40
    assert screen[1] == HEADING == "## Simulated placement (SIMULATED)"
    assert screen[3] == f"cost models: [a] box-fit-v2; [b] {COST}"  # each once, keyed
    assert text.count(COST) == 1 and text.count("box-fit-v2") == 1  # never repeated below
    # the validation's one overall line, naming this box's cost model by its key
    assert screen[5].startswith("SIMULATED (cost model [a]) within 15% of measured at 0 of 1")
    table = [line for line in screen if line.startswith("|")]
    header = table[0].split(" | ")
    assert "SIMULATED" in header[0] and header[1:] == ["peftbd |"]  # a column per method
    assert len(table) - 2 == 1  # one row: the H100 run's (this box's has no colocated)
    [[label, cell]] = _cells(screen)
    assert label == "H100 · Qwen3-8B [b]"
    [v] = report.verdicts
    assert cell == verdict_cell(v)
    # from 16 clients at 105 / 100; best 130 / 110 at 64; decided by split's busier devices
    # (0.925 vs 0.9); split-ahead never beats split up to 16 (best 104 / 105 at 16)
    where, best, term, ahead = cell.split("; ")
    assert where == "from 16 clients, 1.05x"
    assert best == f"best {130 / 110:.2f}x at 64"
    assert v.term == "utilization" and v.utilization == pytest.approx(0.925 / 0.9)
    assert term == f"utilization: {0.925 / 0.9:.2f}x, split's devices busier"
    assert ahead == f"ahead: never <= 16, best {104 / 105:.2f}x at 16"
    assert screen[-1].startswith("Legend:")
    assert "\n".join(sim_summary(report)) == "\n".join(screen)  # as the placement reports show it


def test_a_cell_names_where_split_never_wins_and_the_idle_role():
    [v] = sim_verdicts(_run((30, 60, 90, 100), {"drafter": 0.3, "verifier": 0.95}), 0.5)
    where, best, term = verdict_cell(v).split("; ")
    assert where == "never <= 64" and best == f"best {100 / 110:.2f}x at 64"
    assert term == f"utilization: {v.utilization:.2f}x, drafter idles 70%"
    [none] = sim_verdicts(_run((30, 60, 90, 100), {}), 0.5)
    assert verdict_cell(none).endswith("deciding: not simulated")
    [batching] = sim_verdicts(_run((30, 70, 105, 130), {"drafter": 0.8, "verifier": 0.95}), 0.5)
    assert batching.term == "efficiency"
    assert verdict_cell(batching).split("; ")[2] == (
        f"batching: {(105 / 0.875) / (100 / 0.9):.2f}x tokens per busy device-second")


def test_every_heading_and_table_caption_says_simulated():
    lines, report = _section()
    headings = [line for line in lines if line.startswith("#")]
    # the section, the details, the verdicts in full, the validation and one per run
    assert len(headings) == 6 and all("SIMULATED" in h for h in headings)
    assert headings[1] == DETAILS
    runs = [h for h in headings if h.startswith("#### SIMULATED: ")]
    assert runs == ["#### SIMULATED: this box · Qwen3-0.6B (cost model [a])",
                    "#### SIMULATED: H100 · Qwen3-8B (cost model [b])"]
    tables = [i for i, line in enumerate(lines) if line.startswith("| ")]
    assert len(tables) == 5  # the verdict table, the verdicts in full, validation, two runs
    for i in tables:  # each table's caption: the heading right above it
        caption = next(line for line in reversed(lines[:i]) if line.startswith("#"))
        assert "SIMULATED" in caption
    validation = next(i for i in tables if "measured" in lines[i])
    assert "SIMULATED (cost model [a])" in lines[validation].splitlines()[0]  # this box's key
    assert "n=2 < 3: no interval" in "\n".join(lines)  # too few repeats stays visible
    full = _cells(lines[tables[1]:])
    [[label, method, vs, cap, deciding, ahead]] = full
    [v] = report.verdicts
    assert (label, method, deciding) == ("H100 · Qwen3-8B [b]", "peftbd", v.deciding)
    assert cap == "2.0 colocated vs >= 64.0 split (>= 32.00x)"
    assert vs.startswith("split beats colocated's tok/s per device from 16 clients")
    assert ahead.startswith("split-ahead never beats split's")


def test_the_section_shows_beside_a_placement_output_only_when_simulated(tmp_path):
    placement = tmp_path / "placement"
    placement.mkdir()
    assert beside_lines(placement, placement) == []  # absent: nothing added
    _, report = _section()
    (tmp_path / "placement_sim").mkdir()
    report.write(tmp_path / "placement_sim")
    lines = beside_lines(placement, placement)
    assert lines[1] == "## Simulated placement (SIMULATED)"
    [table] = [line for line in lines if line.startswith("| ")]
    assert table.startswith("| SIMULATED: hardware · model [cost model] | peftbd |")
    assert lines[-1].endswith("(../placement_sim/placement_sim.md)")  # relative to the page
    assert DETAILS not in lines  # the first screen only
    (tmp_path / "placement_sim" / "placement_sim.json").write_text("{not json")
    broken = beside_lines(placement, tmp_path)
    assert "could not be read" in broken[-1] and "placement_sim/placement_sim.md" in broken[-1]


def test_the_report_round_trips_through_placement_sim_json(tmp_path):
    _, report = _section()
    path = report.write(tmp_path)
    assert path.name == "placement_sim.json"
    back = SimReport.read(tmp_path)
    assert back == report
    assert back.verdicts[0].capacity[1] == Capacity(64, censored=True)
    assert back.validation is not None and back.validation[0].interval is None


def test_the_figure_is_written_as_a_png(tmp_path):
    _, report = _section()
    path = sim_figure(report.runs, tmp_path / "placement_sim.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_split_busier_than_colocated_wins_on_utilization_and_bounds_print_as_bounds():
    [v] = sim_verdicts(_run((30, 70, 120, 130), {"drafter": 1.0, "verifier": 1.0}), 0.5)
    # at 16 clients: split's devices busy 1.0 vs colocated's 0.9 (1.11x), per busy second 1.08x
    assert v.split.beats_at == 16 and v.term == "utilization"
    assert v.utilization == pytest.approx(1 / 0.9)
    assert v.capacity_gain == (pytest.approx(32.0), ">=")  # split passed every level
