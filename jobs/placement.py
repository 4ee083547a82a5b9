"""The placement experiment: the same prompts through the colocated and the split app (and, on a
cluster, split across nodes, on one node, on fractional GPUs), per method of
`serving.placement_methods` (greedy AR or any registered drafting method, `peftbd.methods`; empty:
all of them).

    python -m jobs.placement --preset tiny --out outputs/tiny/placement
    python -m jobs.placement --preset qwen3-0.6b --adapter-dir A --mtp-dir M --head-dir H --out ...

Each registered method's trained output dir is its `--<dir_arg>` flag (`Method.dir_arg` with
dashes); without one it serves untrained.

Placements run on the same devices: colocated gets as many Engine replicas as split has
Drafter + Verifier replicas (here: one CPU each). Reports per placement and method, one request
at a time: tokens/s, tokens per round and, per round, draft / verify / sync / other ms
(replica-side) and transport ms (ingress wall time of the remote calls minus the replica-side
time), draft cost / verify cost, verifier feature bytes per token (split head); per client
concurrency (`serving.client_concurrency`, `--concurrency 1,4,16,32`): requests/s, tokens/s
(also per device and per client), p50 / p95 latency, transport per generated token, mean batch,
each replica's busy fraction; and the verdict (`peftbd.analysis.placement_verdict`): per
drafting method, the change in drafting cost per token, the deciding term, capacity per
verifier device against the (1 + t_d / t_v) prediction. `serving.synthetic` methods run at their
controlled acceptance (their greedy references are decoded here first, untimed) and are
labelled so. Written as placement.json and placement.md; placement.md shows this run replayed on
simulated devices (measured beside SIMULATED per level, `peftbd.simulation.study.replayed_lines`) and ends with the simulated
section's first screen (SIMULATED verdict table, cost models, validation line; linking
placement_sim.md) when `python -m jobs.placement_sim` has written placement_sim.json beside the
output dir (`<out>/../placement_sim/`) by the time this runs (read only, not fingerprinted).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import math
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jobs.local_cluster import NodeError, free_port, local_cluster
from jobs.placement_options import (
    CONFIG_CHANGES,
    placement_levels,
    placement_options,
    replica_counts,
    skip_reason,
)
from jobs.ray_env import DASHBOARD_ENV, shutdown
from peftbd.analysis.placement import (
    Devices,
    RequestRecord,
    Window,
    concurrency_summary,
    markdown,
    one_at_a_time,
    outputs_identical,
    summarize,
)
from peftbd.analysis.placement_ahead import AHEAD, ahead_markdown, ahead_sentence, ahead_verdicts
from peftbd.analysis.placement_sim_summary import beside_lines
from peftbd.analysis.placement_verdict import (
    REPORT_FILE,
    PlacementReport,
    PlacementSections,
    sentence,
    verdict_markdown,
    verdicts,
)
from peftbd.cli import (
    add_config_args,
    add_drafter_dir_args,
    add_stage_args,
    config_from_args,
    run_stage_job,
    stage_out,
)
from peftbd.config import Config, load_config
from peftbd.data.sources import first_prompts, resolve_source, source_identity
from peftbd.layout import placement_stage
from peftbd.methods import methods, serving_names
from peftbd.progress import Tally
from peftbd.serving.messages import ReplicaStats
from peftbd.serving.models import DrafterDirs
from peftbd.serving.roles import VERIFIER_ROLES
from peftbd.serving.schemas import SpecStats, Usage
from peftbd.serving.synthetic import method_label, synthetic_rates, write_references
from peftbd.serving.validation import check_serving_config, placement_methods
from peftbd.simulation.study import replayed_lines
from peftbd.stage import StageCall, StageInputs

log = logging.getLogger("peftbd.placement")
def _measure(base_url: str, placement: str, prompts: list[list[int]], cfg: Config,
             model: str, replicas: dict[str, tuple[Any, int]], tally: Tally,
             levels: dict[int, list[int]]) -> tuple[list[RequestRecord], list[Window]]:
    """Every method's requests at each client concurrency in turn (`levels`: clients -> the
    prompt of each request, `level_prompts`): that many requests in flight at all times; and
    each run's busy fraction of every replica of `replicas` ({role's value: (handle,
    replicas)}).
    `tally` counts the answered requests and says each level's throughput."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=1800)
    rates = synthetic_rates(cfg)
    records: list[RequestRecord] = []
    windows: list[Window] = []
    for method in placement_methods(cfg.serving):
        label = method_label(method, rates)
        client.completions.create(model=f"{model}:{method}", prompt=prompts[0], max_tokens=4)
        for concurrency, jobs in levels.items():
            def one(i: int, concurrency: int = concurrency, method: str = method) -> RequestRecord:
                start = time.perf_counter()
                resp = client.completions.create(model=f"{model}:{method}", prompt=prompts[i],
                                                 max_tokens=cfg.decoding.max_new_tokens)
                end = time.perf_counter()
                tally.tick(placement=placement, method=method, clients=concurrency)
                tokens, spec = _usage(resp.usage)
                return RequestRecord(placement, label, i, resp.choices[0].text, tokens,
                                     (end - start) * 1e3, spec, concurrency, start, end)

            before, start = _busy(replicas), time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                level = list(pool.map(one, jobs))
            wall, after = time.perf_counter() - start, _busy(replicas)
            records += level
            tokens = sum(r.completion_tokens for r in level)
            tally.note(f"{placement}, {label}, {concurrency} client{'s' * (concurrency > 1)}: "
                       f"{len(jobs)} requests in {wall:.0f} s, {tokens / wall:.2f} tok/s")
            windows.append(Window(placement, label, concurrency, {
                role: [(after[role][r] - before[role].get(r, 0.0)) / wall for r in after[role]]
                for role in after}))
    return records, windows


def level_prompts(prompts: int, cfg: Config, clients: int) -> list[int]:
    """The prompt of each request a level of `clients` sends: every prompt
    `decoding.repeats` times, or with `serving.level_requests` n > 0 the first max(n, clients)
    of those (cycling), so a level's wall time shrinks where its noise allows."""
    every = [i for _ in range(cfg.decoding.repeats) for i in range(prompts)]
    n = cfg.serving.level_requests
    return every if not n else [every[k % len(every)] for k in range(max(n, clients))]


def _usage(usage: Any) -> tuple[int, SpecStats]:
    """(completion tokens, `usage.speculative`) of a response's usage, read as this server's
    `Usage` (the openai client keeps `speculative` as an extra field)."""
    if usage is None:
        raise ValueError("the server answered without `usage`")
    typed = Usage.model_validate(usage.model_dump())
    if typed.speculative is None:
        raise ValueError("the server answered without `usage.speculative`")
    return typed.completion_tokens, typed.speculative


def _busy(replicas: dict[str, tuple[Any, int]]) -> dict[str, dict[str, float]]:
    """{role: {replica id: busy seconds so far}}: each role's `stats` (`ReplicaStats`) probed
    until every one of its replicas answered (routing picks the replica; a sticky router by
    probe session id)."""
    out = {}
    for role, (handle, count) in replicas.items():
        seen: dict[str, float] = {}
        for attempt in range(64):
            if len(seen) == count:
                break
            probes = [handle.options(session_id=f"probe-{attempt}-{i}").stats.remote()
                      for i in range(2 * count)]
            stats: list[ReplicaStats] = [p.result() for p in probes]
            seen |= {s.replica: s.busy_s for s in stats}
        out[role] = seen
    return out


def placement_call(cfg: Config, out_dir: str | Path, drafter_dirs: DrafterDirs | None = None
                   ) -> StageCall:
    """The placement experiment as a stage (`peftbd.layout.PLACEMENT`): reruns only when the
    config it reads, the drafters (`drafter_dirs`: each a registered method's main stage's
    output, an upstream) or the serving code changed."""
    check_serving_config(cfg.serving)
    dirs = drafter_dirs or {}
    upstream = {m.stage.name: Path(d) for m in methods() if m.stage and (d := dirs.get(m.serving))}
    build = functools.partial(_measure_placements, cfg=cfg, upstream=upstream, out_dir=Path(out_dir))
    return StageCall(placement_stage(), cfg.to_dict(), Path(out_dir), upstream, build,
                     extra={"source": source_identity(cfg)})  # a local source: its content


def run_placement(cfg: Config, out_dir: str | Path, drafter_dirs: DrafterDirs | None = None,
                  force: bool = False) -> Path:
    """Run every placement in `cfg.serving.placements` (those the cluster cannot host are
    skipped with the reason); write placement.json, placement.md and manifest.json."""
    placement_call(cfg, out_dir, drafter_dirs).run(force)
    return Path(out_dir)


def _measure_placements(tmp: Path, _inputs: StageInputs, cfg: Config,
                        upstream: dict[str, Path], out_dir: Path) -> dict[str, Any]:
    import ray
    from ray import serve

    from jobs.ray_env import init_ray
    from peftbd.models.loading import load_tokenizer
    from serve_apps import colocated, split
    from serve_apps.args import AppArgs

    init_ray()
    prompts = first_prompts(load_tokenizer(cfg), resolve_source(cfg), cfg.decoding.num_prompts,
                            cfg.serving.max_prompt_tokens)
    dirs = {m.serving: str(upstream[m.stage.name]) for m in methods()
            if m.stage and m.stage.name in upstream}
    references = None
    if cfg.serving.synthetic:  # the synthetic methods' oracle: greedy AR here, untimed
        references = tmp / "references.json"
        write_references(references, greedy_references(cfg, prompts))
    args = AppArgs(preset=cfg.preset, overrides=_overrides(cfg), drafter_dirs=dirs,
                   references=str(references) if references else None)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    builders = {"colocated": colocated.build, "split": split.build}
    records: list[RequestRecord] = []
    windows: list[Window] = []
    devices: dict[str, Devices] = {}
    skipped: dict[str, str] = {}
    runnable = []
    for name in cfg.serving.placements:
        app, options = placement_options(name, cfg)
        reason = skip_reason(options, ray.cluster_resources())
        if reason:
            skipped[name] = reason
            log.info("placement %s: skipped (%s)", name, reason)
        else:
            runnable.append((name, app, options))
    levels = {name: {c: level_prompts(len(prompts), cfg, c) for c in placement_levels(name, cfg)}
              for name, _, _ in runnable}
    tally = Tally(len(placement_methods(cfg.serving))
                  * sum(len(jobs) for by in levels.values() for jobs in by.values()))
    for name, app, options in runnable:
        log.info("placement %s: deploying the %s app", name, app)
        app_args = args.model_copy(update={"overrides": args.overrides + CONFIG_CHANGES.get(name, [])})
        serve.run(builders[app](app_args, options), name="placement", route_prefix="/placement")
        roles = replica_counts(app, options, cfg)
        replicas = {role.value: (serve.get_deployment_handle(role.deployment, "placement"), n)
                    for role, n in roles.items()}
        devices[name] = Devices(total=sum(roles.values()),
                                verifiers=sum(n for role, n in roles.items() if role in VERIFIER_ROLES))
        measured, loads = _measure(f"http://127.0.0.1:{port}/placement/v1", name, prompts, cfg,
                                   cfg.serving.model_name, replicas, tally, levels[name])
        records, windows = records + measured, windows + loads
        serve.delete("placement")
    serve.shutdown()
    summary = summarize(one_at_a_time(records))
    by_concurrency = concurrency_summary(records, windows, devices)
    found = verdicts(summary, by_concurrency, devices, cfg.serving.capacity_fraction)
    ahead = ahead_verdicts(by_concurrency)
    notes = [
        f"{len(prompts)} prompts x {cfg.decoding.repeats} repeats per method, max_tokens "
        f"{cfg.decoding.max_new_tokens}, client concurrency "
        f"{list(cfg.serving.client_concurrency)} (the first table: the lowest), requests per "
        "level " + ", ".join(f"{c}: {len(jobs)}" for c, jobs in
                             {c: j for by in levels.values() for c, j in by.items()}.items())
        + f" (serving.level_requests {cfg.serving.level_requests}); serving.max_batch "
        f"{cfg.serving.max_batch}, batch_wait_ms {cfg.serving.batch_wait_ms}; preset {cfg.preset}",
        "; ".join(f"{m.what}: {dirs.get(m.serving, 'untrained')}" for m in methods()),
        "devices: " + ", ".join(f"{p} {d.total} ({d.verifiers} holding a verifier)"
                                for p, d in devices.items())
        + f"; serving.split_groups {cfg.serving.split_groups}, replica_num_cpus "
          f"{cfg.serving.replica_num_cpus}, decoding.torch_threads {cfg.decoding.torch_threads}",
        "timings on a shared machine are noisy; compare placements within one run",
    ]
    if AHEAD in devices:
        notes.append(f"split-ahead: split drafting ahead at {list(cfg.serving.ahead_levels)} "
                     "client(s)")
    report = PlacementReport(summary=summary, concurrency=by_concurrency, skipped=skipped,
                             notes=notes, devices=devices, verdicts=found,
                             outputs_identical=outputs_identical(records), requests=records,
                             ahead=ahead)
    report.write(tmp)
    (tmp / "placement.md").write_text(markdown(summary, skipped, notes, by_concurrency)
                                      + "\n".join(verdict_markdown(found, cfg.serving.capacity_fraction)
                                                  + ahead_markdown(ahead)
                                                  + replayed_lines(cfg, report, prompts)
                                                  + beside_lines(out_dir, out_dir)) + "\n")
    return PlacementSections(  # the main report summarises these
        counts={"prompts": len(prompts), "requests": len(records)}, placements=list(devices),
        skipped=skipped, outputs_identical=report.outputs_identical,
        verdicts=[sentence(v) for v in found] + [ahead_sentence(v) for v in ahead]).to_sections()


def greedy_references(cfg: Config, prompts: list[list[int]]) -> dict[tuple[int, ...], list[int]]:
    """Greedy AR's output of every prompt (the verifier of `cfg`, in this process)."""
    from peftbd.data.continuations import greedy_continuations
    from peftbd.models.loading import eos_token_ids, load_tokenizer, load_verifier

    model = load_verifier(cfg)
    outputs = greedy_continuations(model, prompts, cfg.decoding.max_new_tokens,
                                   eos_token_ids(model, load_tokenizer(cfg)))
    return {tuple(p): o.ids for p, o in zip(prompts, outputs)}


def _overrides(cfg: Config) -> list[str]:
    """`--set` overrides that turn `cfg.preset` into `cfg`, so the replicas rebuild this config."""
    flat: list[str] = []

    def diff(prefix: str, value: Any, base: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                diff(f"{prefix}{k}.", v, base[k])
        elif value != base:
            flat.append(f"{prefix[:-1]}={json.dumps(value)}")

    diff("", cfg.to_dict(), load_config(cfg.preset).to_dict())
    return flat


def _skipped_some(out: Path) -> bool:
    """`out` holds a placement.json that skipped some placement (or one this code cannot read)."""
    if not (out / REPORT_FILE).is_file():
        return False
    try:
        return bool(PlacementReport.read(out / REPORT_FILE).skipped)
    except ValueError:  # a report of another shape (pydantic's ValidationError): rebuild it
        return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jobs.placement", description=__doc__.split("\n\n")[0])
    add_config_args(parser)
    placement = placement_stage()
    add_stage_args(parser, placement)
    add_drafter_dir_args(parser, "untrained")
    parser.add_argument("--drafter-dir", action="append", default=[], metavar="METHOD=DIR",
                        help="any trained method's output dir, e.g. a methods.plugins method's "
                             "(repeatable)")
    parser.add_argument("--methods", default=None,
                        help="methods to measure, e.g. ar,peftbd (sets serving.placement_methods; "
                             f"registered: {','.join(serving_names())})")
    parser.add_argument("--concurrency", default=None,
                        help="client concurrencies to measure, e.g. 1,4,16 (sets "
                             "serving.client_concurrency)")
    parser.add_argument("--placements", default=None,
                        help="placements to measure, e.g. colocated,split-cross-node (sets "
                             "serving.placements)")
    parser.add_argument("--local-cluster", action="store_true",
                        help="run on a two-node Ray cluster started on this machine for the run "
                             "and stopped after it (jobs.local_cluster: a `verifier` head and a "
                             "`drafter` worker, no GPUs), so the placements that need them "
                             "(--placements split-cross-node,split-same-node,split-fractional-gpu) "
                             "run instead of being skipped; an output that skipped some is rebuilt")
    args = parser.parse_args(argv)
    if args.concurrency:
        args.overrides.append(f"serving.client_concurrency=[{args.concurrency}]")
    if args.methods:
        args.overrides.append(f"serving.placement_methods=[{args.methods}]")
    if args.placements:
        args.overrides.append(f"serving.placements=[{args.placements}]")
    cfg = config_from_args(args)
    out = stage_out(args, cfg, placement)
    dirs = {m.serving: getattr(args, m.dir_arg, None) for m in methods()}
    for item in args.drafter_dir:
        name, sep, path = item.partition("=")
        if not sep or name not in dirs:
            parser.error(f"--drafter-dir {item!r}: use METHOD=DIR with METHOD one of {', '.join(dirs)}")
        dirs[name] = path
    call = lambda: placement_call(cfg, out, dirs)  # noqa: E731
    force = args.force
    with contextlib.ExitStack() as stack:
        if args.local_cluster:
            s = cfg.serving
            if s.drafter_num_gpus or s.verifier_num_gpus:
                parser.error("--local-cluster has no GPUs: serving.drafter_num_gpus and "
                             "verifier_num_gpus must be 0 (e.g. --set model.device=cpu)")
            force = force or _skipped_some(out)
            try:  # each node: two replicas (split-same-node, split-fractional-gpu) + the Ingress
                cluster = stack.enter_context(local_cluster(
                    math.ceil(2 * s.replica_num_cpus + 0.1),
                    dashboard=os.environ.get(DASHBOARD_ENV, "1") != "0"))
            except NodeError as exc:
                sys.exit(f"error: {exc}")
            print(f"[placement] local cluster at {cluster.address}, dashboard "
                  f"{cluster.dashboard_url or 'off'}; stopped after the run", flush=True)
        # plain ValueErrors too (as before UserError): one line each
        run_stage_job(placement, out, call, force, args.verbose, (ValueError,),
                      before_exit=shutdown)
    print((out / "placement.md").read_text())
    print(f"[placement] wrote {out / 'placement.json'} and {out / 'placement.md'}", flush=True)


if __name__ == "__main__":
    main()
