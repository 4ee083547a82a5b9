"""Shared command-line options: every job takes --preset, --config, --set; stage jobs also
--out and --force."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from peftbd.config import Config, load_config, preset_names
from peftbd.console import Console
from peftbd.errors import UserError, error_line, one_line, user_error
from peftbd.manifest import is_complete
from peftbd.methods import methods
from peftbd.output_lock import check_writable
from peftbd.process_setup import ready
from peftbd.stage import Decision, StageCall, StageSpec


def add_config_args(parser: argparse.ArgumentParser) -> None:
    """Add --preset, --config and --set to a job's parser."""
    parser.add_argument(
        "--preset", default="tiny", choices=preset_names(),
        help="named configuration: 'tiny' is the embedded world (CPU, no network); "
        "'qwen3-0.6b' is the paper's setting (default: tiny)",
    )
    parser.add_argument(
        "--config", metavar="FILE.yaml", default=None,
        help="YAML file with the same sections as the config tree, applied over the preset",
    )
    parser.add_argument(
        "--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
        help="override one config value, e.g. --set peftbd.block_size=16 "
        "--set data.train_size=2000 (repeatable; values parse as YAML). Settings that would "
        "publish an untrained drafter (*.optim.max_steps=0, *.optim.lr=0, fastmtp.loss_weights all 0, "
        "no train rows) are refused unless --set training.allow_untrained=true (its manifest "
        "then says untrained)",
    )


def config_from_args(args: argparse.Namespace, ready_process: bool = True) -> Config:
    """Build the config from parsed args and make this process ready for it
    (`peftbd.process_setup.ready`: its plugins, its tiny world; `ready_process=False`: plugins
    only, for the main job, whose plan holds the world stage); a bad key or value (`ConfigError`,
    a `UserError`) exits with status 2 and the one line `error: <reason>`."""
    try:
        cfg = load_config(args.preset, args.config, args.overrides)
        return ready(cfg) if ready_process else cfg
    except UserError as exc:
        print(error_line(exc), file=sys.stderr)
        sys.exit(2)


LOGS = "logs"
"""Per-stage log files go to `<output root>/logs/<stage>.log`."""


def add_drafter_dir_args(parser: argparse.ArgumentParser, default: str) -> None:
    """A `--<id>-dir` flag per registered method that trains (`Method.dir_arg`, dest too): its
    training stage's output dir; `default` says what an absent flag means ({id}: the method's)."""
    for m in methods():
        if m.stage is not None:
            parser.add_argument(f"--{m.dir_arg.replace('_', '-')}", dest=m.dir_arg, default=None,
                                help=f"a trained {m.what}: the output dir of {m.stage.name} "
                                     f"(serves {m.serving}; default: {default.format(id=m.id)})")


def add_verbose_arg(parser: argparse.ArgumentParser) -> None:
    """Add -v: library and Ray output on the terminal instead of the per-stage log files."""
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show every library's and Ray's output on the terminal (default: "
                             f"only this job's lines and progress bars; the rest in {LOGS}/<stage>.log "
                             "under the output root)")


def output_root(cfg: Config) -> Path:
    """The main job's default output root: `<paths.out_dir>/<preset>`."""
    return Path(cfg.paths.out_dir) / cfg.preset


def add_stage_args(parser: argparse.ArgumentParser, spec: StageSpec | None = None) -> None:
    """Add a stage job's --out (default: the main job's layout; `spec` None: the job adds its
    own), --force and -v."""
    if spec is not None:
        parser.add_argument(
            "--out", type=Path, default=None,
            help=f"output directory (default: <paths.out_dir>/<preset>/{spec.subdir}, the main job's layout)",
        )
    parser.add_argument(
        "--force", action="store_true",
        help="rebuild even when the output is current (its inputs, config and code unchanged)",
    )
    add_verbose_arg(parser)


def stage_out(args: argparse.Namespace, cfg: Config, spec: StageSpec) -> Path:
    """--out, or the stage's directory in the main job's layout."""
    return args.out or output_root(cfg) / spec.subdir


def plan_line(spec: StageSpec, out: Path, decision: Decision) -> str | None:
    """What a stage job is about to replace and why (e.g. `config peftbd.lora_r 16 -> 8`), said
    before any work; None when there is no finished output or it is skipped."""
    if not decision.run or not is_complete(out):
        return None
    return (f"{spec.name}: rebuilding {out.resolve()} ({decision.describe()}); the output there "
            f"stays until the new one is complete (to keep both, pass another --out)")


def decision_line(spec: StageSpec, out: Path, decision: Decision) -> str:
    """One line saying what a stage job did and why."""
    done = f"built ({decision.describe()})" if decision.run else "current, skipped (inputs unchanged)"
    return f"{spec.name}: {done} -> {out.resolve()}"


def exit_on_user_error(exc: BaseException, also: tuple[type[BaseException], ...] = ()) -> None:
    """Exit with the one line `error: <message>` (status 1, no traceback) when `exc` is or wraps
    a `UserError` (`peftbd.errors.user_error`: Ray's task, actor and worker wrappers too), or is
    one of `also`; otherwise return, and the caller re-raises `exc`."""
    if (err := user_error(exc)) is not None:
        sys.exit(error_line(err))
    if also and isinstance(exc, also):
        cause = vars(exc).get("cause")  # a RayTaskError's text is the worker's traceback
        sys.exit(f"error: {one_line(str(cause if isinstance(cause, BaseException) else exc))}")


def run_stage_job(spec: StageSpec, out: Path, make_call: Callable[[], StageCall], force: bool,
                  verbose: bool, errors: tuple[type[Exception], ...] = (),
                  before_exit: Callable[[], None] | None = None) -> Decision:
    """Run one stage job on the terminal: library and Ray output in `<out>/../logs/<stage>.log`
    (unless `verbose`), a progress bar, then the line saying what was done; a `UserError` (the
    message names the fix; `peftbd.errors`), or an error of the further kinds in `errors`, exits
    with the one line `error: <message>`; so does an `--out` that is not writable or that
    another run holds, before any work. `before_exit`: see `Console`."""
    try:
        check_writable(out)  # before the log dir beside it and before Ray starts
    except UserError as exc:
        sys.exit(error_line(exc))
    with Console(out.parent / LOGS, verbose, before_exit) as console:
        log_path = console.log_path(spec.name)
        if log_path:
            console.line(f"{spec.name}: log in {log_path}")
        try:
            call = make_call()
            decision = call.decide(force)
            if line := plan_line(spec, out, decision):
                console.line(line)
            with console.stage(spec.name, spec.title):
                call.run(force, decision)
        except Exception as exc:
            exit_on_user_error(exc, errors)
            raise
        console.line(decision_line(spec, out, decision))
    return decision
