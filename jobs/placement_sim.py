"""Placement on simulated devices (every number SIMULATED, labelled with its cost model): the
engine's own scheduler and step-loop decisions on a virtual clock (`peftbd.simulation`), no
forward run, no Ray.

    python -m jobs.placement_sim --hardware h100,h200 --model qwen3-0.6b,qwen3-8b
    python -m jobs.placement_sim --preset tiny --measured outputs/tiny/placement --measured R2 ...

Validation (`--measured`, each a placement run's output dir or placement.json: repeats of one
`python -m jobs.placement`; default: the preset's own placement output when it exists): the runs'
levels replayed on this box's cost model fitted from their own ledgers, measured (mean, 95%
interval over the repeats) beside simulated. Projection (`--hardware`, `--model`): colocated and
split (and split drafting ahead) on one and two GPUs at 1-64 clients for PEFT-BD at 2.881, FastMTP at 1.511 and the head at
5.3 tokens per round, each forward priced at the GPU's bf16 roofline plus a per-forward overhead
taken from the paper's SGLang AR step. Writes placement_sim.json, placement_sim.md and
placement_sim.png to --out (default: outputs/<preset>/placement_sim); the placement report shows
the section when it exists.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from peftbd.analysis.placement_sim import SimReport, SimulatedRun, sim_verdicts, validate
from peftbd.analysis.placement_sim_report import sim_figure, sim_markdown
from peftbd.analysis.placement_sim_summary import SIM_SUBDIR
from peftbd.analysis.placement_verdict import REPORT_FILE, PlacementReport
from peftbd.benchmarking.roofline import GPUS
from peftbd.cli import add_config_args, config_from_args, output_root
from peftbd.config import Config
from peftbd.config_merge import ConfigError
from peftbd.errors import error_line, one_line, user_error
from peftbd.methods import methods
from peftbd.simulation.roofline_cost import ROOFLINE_MODELS, Decoder, RooflineCost
from peftbd.simulation.study import (
    PAPER_TOKENS_PER_ROUND,
    PROJECTION_CLIENTS,
    Workload,
    paper_method,
    project,
    projection_setups,
    validation_run,
)

SHIPS_PER_TOKEN = {"kv": lambda a: 2 * a.kv_per_token(), "hidden": lambda a: 2 * a.hidden_size,
                   "features": lambda a: 2 * 3 * a.hidden_size}
"""Bytes of verifier state a split Verifier ships per committed token at bf16, by `Method.ships`:
every layer's KV (PEFT-BD), the final hidden state (FastMTP), three layers' features (the head,
as `DraftSizes.head` reads)."""


def measured_reports(paths: list[str], cfg: Config) -> list[tuple[str, PlacementReport]]:
    """(path, report) of each `--measured` path (default: the preset's placement output if any)."""
    if not paths:
        default = output_root(cfg) / "placement"
        paths = [str(default)] if (default / REPORT_FILE).is_file() else []
    out = []
    for p in paths:
        path = Path(p) / REPORT_FILE if Path(p).is_dir() else Path(p)
        if not path.is_file():
            raise ConfigError(f"--measured {p}: no {REPORT_FILE} there; pass a placement run's "
                              "output dir (python -m jobs.placement --out DIR)")
        try:
            out.append((str(path), PlacementReport.read(path)))
        except ValueError as exc:
            raise ConfigError(f"--measured {p}: {path} is not a placement report this code reads "
                              f"({one_line(str(exc))[:200]}); rerun python -m jobs.placement") from exc
    return out


def projection_runs(cfg: Config, hardware: list[str], models: list[str], max_batch: int,
                    workload: Workload, clients: tuple[int, ...]) -> list[SimulatedRun]:
    """Colocated, split and split-ahead on 1 and 2 GPUs of each hardware, for each model: one
    process per (model, hardware) on the machine's cores."""
    jobs = [(cfg, model, hw, max_batch, workload, clients) for model in models for hw in hardware]
    if len(jobs) < 2:
        return [run for job in jobs for run in _project(*job)]
    with ProcessPoolExecutor(min(len(jobs), os.cpu_count() or 1)) as pool:
        return [run for runs in pool.map(_project, *zip(*jobs)) for run in runs]


def _project(cfg: Config, model: str, hw: str, max_batch: int, workload: Workload,
             clients: tuple[int, ...]) -> list[SimulatedRun]:
    arch = ROOFLINE_MODELS[model]
    positions = {m.serving: (m.positions(cfg), m.ships) for m in methods()}
    drafting = [paper_method(name, positions[name][0], _ships(arch, positions[name][1]))
                for name in PAPER_TOKENS_PER_ROUND]
    cost = RooflineCost(GPUS[hw], model, arch)
    runs = []
    for gpus in (1, 2):
        setups = projection_setups(cost, gpus, max_batch, cfg.serving.batch_wait_ms,
                                   cfg.decoding.prefill_chunk, cfg.serving.split_groups)
        sim = project(setups, drafting, workload, clients)
        runs.append(SimulatedRun(f"{hw} x{gpus}", arch.label, cost.name, sim.rows(), sim.devices))
    return runs


def _ships(arch: Decoder, ships: str | None) -> int:
    return SHIPS_PER_TOKEN[ships](arch) if ships else 0


def _names(text: str, known: list[str], flag: str, parser: argparse.ArgumentParser) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        parser.error(f"{flag} {text!r}: use a comma-separated list of {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.placement_sim",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 2)[2])
    add_config_args(parser)
    parser.add_argument("--out", default=None, help="output dir (default: outputs/<preset>/placement_sim)")
    parser.add_argument("--measured", action="append", default=[], metavar="DIR",
                        help="a measured placement run to validate against (repeatable: its "
                             "repeats; >= 3 give intervals)")
    parser.add_argument("--hardware", default="H100,H200",
                        help=f"GPUs to project to (of {', '.join(GPUS)}; '' skips the projection)")
    parser.add_argument("--model", default=",".join(ROOFLINE_MODELS),
                        help=f"architectures to project (of {', '.join(ROOFLINE_MODELS)})")
    parser.add_argument("--max-batch", type=int, default=64,
                        help="the projection's serving.max_batch: requests a GPU replica steps "
                             "together per group (default 64)")
    parser.add_argument("--clients", default=",".join(map(str, PROJECTION_CLIENTS)),
                        help="the projection's client levels")
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    upper = {k.upper(): k for k in GPUS}
    hardware = [upper[h.upper()] if h.upper() in upper else h for h in args.hardware.split(",") if h]
    hardware = _names(",".join(hardware), list(GPUS), "--hardware", parser) if hardware else []
    models = _names(args.model.lower(), list(ROOFLINE_MODELS), "--model", parser)
    try:
        clients = tuple(int(c) for c in args.clients.split(","))
    except ValueError:
        parser.error(f"--clients {args.clients!r}: comma-separated client counts, e.g. 1,4,16")
    out = Path(args.out or output_root(cfg) / SIM_SUBDIR)
    try:
        run(cfg, args.measured, hardware, models, args.max_batch, clients, out)
    except Exception as exc:  # a UserError (here or in what it calls): one line, no traceback
        found = user_error(exc)
        if found is None:
            raise
        sys.exit(error_line(found))


def run(cfg: Config, measured: list[str], hardware: list[str], models: list[str], max_batch: int,
        clients: tuple[int, ...], out: Path) -> None:
    """Validate against `measured` runs (if any), project, write `out` (see module doc)."""
    start = time.perf_counter()
    reports = measured_reports(measured, cfg)
    runs, validation = [], None
    if reports:
        box = validation_run(cfg, [r for _, r in reports])
        runs.append(box)
        validation = validate([r.concurrency for _, r in reports], box.rows)
        print(f"[placement_sim] validated against {len(reports)} measured run(s)", flush=True)
    runs += projection_runs(cfg, hardware, models, max_batch, Workload(), clients)
    verdicts = [v for run in runs for v in sim_verdicts(run, cfg.serving.capacity_fraction)]
    report = SimReport(runs=runs, validation=validation, verdicts=verdicts)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".placement_sim.", dir=out.parent))
    report.write(tmp)
    text = "\n".join(sim_markdown(runs, validation, verdicts)) + "\n"
    (tmp / "placement_sim.md").write_text(text)
    sim_figure(runs, tmp / "placement_sim.png")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(text)
    print(f"[placement_sim] wrote {out} in {time.perf_counter() - start:.1f} s", flush=True)


if __name__ == "__main__":
    main()
