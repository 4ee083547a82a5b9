"""The README's results table, generated from a run (never hand-copied).

    python -m peftbd.analysis.readme_table                 # outputs/tiny, README.md
    python -m peftbd.analysis.readme_table OUT_ROOT --readme README.md

`render(results, pipeline_manifest)` is a pure function of the benchmark's results.json (types:
`peftbd.benchmarking.schema.Results`) and, optionally, the main job's manifest (`OUT_ROOT/manifest.json`,
written by `jobs.pipeline`): one row per arm (accepted tokens per round, tok/s at batch 1 and
speedup vs AR, each with its 95% interval over the prompts when results.json has one, the greedy
audit) and one caption line saying what ran. The CLI replaces what lies
between the README's `<!-- results:begin -->` and `<!-- results:end -->` lines with it and
touches nothing else; rerunning it on the same run changes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from peftbd.analysis.report import untrained_note
from peftbd.analysis.tables import fmt, fmt_ci, fmt_tokens_per_s, markdown_table
from peftbd.benchmarking.schema import Arm, Results
from peftbd.methods.arm import AR
from peftbd.errors import UserError, error_line, user_error
from peftbd.layout import benchmark_stage
from peftbd.intervals import METHOD

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"
RESULTS = "results.json"
PIPELINE_MANIFEST = "manifest.json"
HEADER = ("arm", "accepted tokens / round", "tok/s, batch 1", "speedup vs AR", "exact audit")


class ReadmeTableError(UserError, ValueError):
    """What stops the table from being written (no results, no markers, an unreadable README),
    said in one line that names the fix."""


def _speedup(arm: Arm, ar_tps: float | None) -> str | None:
    """tok/s over AR's: results.json's paired `speedup_vs_ar` (with its interval) when it has
    one, else the ratio of the two arms' mean tok/s; None without AR."""
    paired = arm.speedup_vs_ar
    if paired is not None and arm.speculative:
        return fmt_ci(paired.mean, paired.ci95, 2)
    return fmt(arm.tokens_per_s.mean / ar_tps, 2) if ar_tps else None


def _audit(arm: Arm) -> str | None:
    if not arm.speculative:
        return "reference"
    return None if arm.audit is None else f"{arm.audit.exact}/{arm.audit.prompts}"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"


def caption(results: Results, pipeline_manifest: dict[str, Any] | None = None) -> str:
    """One line: the preset, prompts x new tokens, the machine and the date results.json records,
    and the main job's wall time when its manifest (of the same preset) is given."""
    mo, pr, repeats = results.measured_on, results.prompts, results.timing.repeats
    parts = [f"preset `{results.preset}`",
             f"{pr.count} {pr.source} prompts x {pr.max_new_tokens} new tokens, greedy"
             + (f", {repeats} timed repeat{'s' if repeats != 1 else ''} per arm" if repeats else ""),
             f"{mo.hardware} ({mo.device}, {mo.dtype})",
             *([f"in parentheses: 95% intervals over the prompts ({METHOD})"]
               if any(arm.tokens_per_s.ci95 for _, arm in results.arm_items()) else []),
             f"run of {results.created[:10]}"]
    m = pipeline_manifest
    if m and m.get("wall_seconds") is not None and m.get("preset", results.preset) == results.preset:
        stages = m.get("stages") or []
        ran = sum(1 for s in stages if s.get("ran"))
        parts.append(f"main job {_duration(m['wall_seconds'])}"
                     + (f" ({ran} of {len(stages)} stages ran)" if stages else ""))
    line = "_" + "; ".join(parts) + "._"
    note = untrained_note(results)
    return f"{line} {note}" if note else line


def render(results: Results, pipeline_manifest: dict[str, Any] | None = None) -> str:
    """The README's results table (markdown) and its caption line, from `results` (results.json)
    and the main job's manifest (None: no wall time in the caption)."""
    arms = results.arm_items()
    if not arms:
        raise ReadmeTableError("results.json has no arms; rerun the benchmark "
                               "(python -m jobs.pipeline --force benchmark)")
    ar = results.arms.get(AR)
    ar_tps = ar.tokens_per_s.mean if ar else None
    rows = [[arm.label, fmt_ci(arm.mean_accepted.mean, arm.mean_accepted_ci95, 2),
             fmt_tokens_per_s(arm.tokens_per_s, len(arm.repeats)),
             _speedup(arm, ar_tps), _audit(arm)] for _, arm in arms]
    return markdown_table(HEADER, rows) + "\n\n" + caption(results, pipeline_manifest)


def replace_between_markers(text: str, block: str, name: str = "README.md") -> str:
    """`text` with the lines between its one BEGIN and one END marker replaced by `block`;
    everything outside the markers (the markers included) is kept byte for byte."""
    begins, ends = text.count(BEGIN), text.count(END)
    if begins != 1 or ends != 1:
        found = f"{begins} `{BEGIN}` and {ends} `{END}`"
        raise ReadmeTableError(f"{name} needs exactly one `{BEGIN}` line and one `{END}` line "
                               f"below it, around the results table; found {found}")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    if end < start:
        raise ReadmeTableError(f"{name}: `{END}` comes before `{BEGIN}`; put the begin marker first")
    return text[:start] + "\n" + block.strip("\n") + "\n" + text[end:]


def _read_json(path: Path, what: str, fix: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ReadmeTableError(f"no {what} at {path}; {fix}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ReadmeTableError(f"cannot read {what} {path} ({exc}); {fix}") from None


def _read_results(path: Path) -> Results:
    """The run's results.json, checked (`Results.read`: a file that does not fit names its key
    and the fix)."""
    fix = ("run the main job first (python -m jobs.pipeline) or pass its output root: "
           "python -m peftbd.analysis.readme_table OUT_ROOT")
    try:
        return Results.read(path)
    except FileNotFoundError:
        raise ReadmeTableError(f"no benchmark results at {path}; {fix}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ReadmeTableError(f"cannot read benchmark results {path} ({exc}); {fix}") from None


def update_readme(out_root: Path, readme: Path) -> bool:
    """Write the table of the run under `out_root` into `readme`; True when the file changed."""
    results = _read_results(out_root / benchmark_stage().subdir / RESULTS)
    manifest_path = out_root / PIPELINE_MANIFEST
    manifest = (_read_json(manifest_path, "main job manifest", "rerun the main job")
                if manifest_path.is_file() else None)
    try:
        text = readme.read_text()
    except OSError as exc:
        raise ReadmeTableError(f"cannot read {readme} ({exc.strerror}); pass the README with "
                               "--readme PATH") from None
    new = replace_between_markers(text, render(results, manifest), str(readme))
    if new == text:
        return False
    readme.write_text(new)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m peftbd.analysis.readme_table",
        description="Write the results table of a main-job run into the README, between its "
        f"{BEGIN} and {END} lines (nothing else changes).")
    parser.add_argument("out_root", nargs="?", type=Path, default=Path("outputs/tiny"),
                        metavar="OUT_ROOT", help="the main job's output root: reads "
                        "OUT_ROOT/benchmark/results.json and OUT_ROOT/manifest.json "
                        "(default: outputs/tiny)")
    parser.add_argument("--readme", type=Path, default=Path("README.md"),
                        help="the file to update (default: README.md)")
    args = parser.parse_args(argv)
    try:
        changed = update_readme(args.out_root, args.readme)
    except Exception as exc:  # a UserError: its one line (peftbd.errors); anything else is a bug
        if (err := user_error(exc)) is not None:
            sys.exit(error_line(err))
        raise
    print(f"{args.readme}: results table {'updated' if changed else 'already current'} "
          f"from {args.out_root / benchmark_stage().subdir / RESULTS}")


if __name__ == "__main__":
    main()
