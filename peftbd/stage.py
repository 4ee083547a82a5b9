"""The stage contract: every job (and every step of the main job) declares what it reads, is
skipped only when a complete output of exactly those inputs exists, and writes atomically.

A stage's inputs are the config values it reads (`StageSpec.reads`, whole sections or single
keys), the artifacts of upstream stages it consumes (each identified by its fingerprint and its
run id), the source of the code that decides its output (`StageSpec.code`) and extra values of
the call (a source file's signature, `--limit`, ...). Their hash is the stage's fingerprint.

A stage reruns when its output is missing, its fingerprint differs, or an upstream artifact is
another run than the one it was built from (so a rerun upstream always reruns what follows);
`decide` says which of these and what changed. The output is built in a `.partial` sibling and
renamed into place with `manifest.json` written last, so a half-written artifact never looks
complete; one run at a time holds an output (`peftbd.output_lock`). An output without the contract's fields (an older layout) is never taken as valid.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
import json
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from peftbd.errors import UserError
from peftbd.manifest import (
    StageTimer,
    atomic_output_dir,
    is_complete,
    read_manifest,
    versions,
    write_manifest,
)
from peftbd.output_lock import output_lock

log = logging.getLogger(__name__)

CONTRACT_VERSION = 1
"""Bumped when the manifest's contract fields change meaning; older outputs then fail clearly."""


class StageError(UserError, RuntimeError):
    """An output or input that the contract cannot vouch for; the message says how to proceed."""


@dataclass(frozen=True)
class StageSpec:
    """What a stage is and what decides its output.

    `reads`: dotted config paths (a section like "model" or a key like "peftbd.block_size");
    `ignores`: paths under `reads` that only say where or how fast (not what) it computes;
    `inputs`: the upstream stages whose artifacts it consumes;
    `code`: modules or packages whose source decides the output;
    `command`: how to run it alone (named when a downstream stage misses its artifact).
    Two stages with the same `job` (e.g. both PEFT-BD adapters) accept each other's outputs.
    """

    name: str
    title: str
    subdir: str
    reads: tuple[str, ...]
    ignores: tuple[str, ...] = ()
    inputs: tuple[StageSpec, ...] = ()
    code: tuple[str, ...] = ()
    command: str = ""
    job: str = ""  # the job that computes it, when several stages share one (default: name)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)


@dataclass(frozen=True)
class Upstream:
    """A finished upstream artifact as a downstream stage records it."""

    fingerprint: str
    run_id: str
    path: str

    @classmethod
    def of(cls, out_dir: str | Path, producer: StageSpec | None = None, needed_by: str = "") -> Upstream:
        """The artifact in `out_dir` (made by `producer`); fails when it is missing or from an
        older layout, naming how to build it."""
        out_dir = Path(out_dir)
        if not is_complete(out_dir):
            what = f"{producer.name} artifact" if producer else "artifact"
            who = f" for {needed_by}" if needed_by else ""
            how = f"build it with {producer.command} --out {out_dir}, or " if producer and producer.command else ""
            raise StageError(f"{out_dir} holds no finished {what}{who} (no {out_dir}/manifest.json); "
                             f"{how}run the main job: python -m jobs.pipeline")
        contract = _contract(out_dir)
        return cls(contract["fingerprint"], contract["run_id"], str(out_dir.resolve()))


@dataclass(frozen=True)
class StageInputs:
    """Everything that decides a stage's output; `fingerprint` hashes it."""

    stage: str
    config: dict[str, Any]
    upstream: dict[str, Upstream]
    code: dict[str, str]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def fingerprint(self) -> str:
        payload = {
            "contract": CONTRACT_VERSION, "stage": self.stage, "config": self.config,
            "upstream": {k: u.fingerprint for k, u in sorted(self.upstream.items())},
            "code": self.code, "extra": self.extra,
        }
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def record(self) -> dict[str, Any]:
        """The manifest's `contract` section (without the run id)."""
        return {
            "version": CONTRACT_VERSION, "stage": self.stage, "fingerprint": self.fingerprint,
            "config": self.config, "code": self.code, "extra": self.extra,
            "upstream": {k: dataclasses.asdict(u) for k, u in self.upstream.items()},
        }


@dataclass(frozen=True)
class Decision:
    """Whether a stage runs, and why (empty reasons: skipped, its output is current)."""

    run: bool
    reasons: tuple[str, ...]

    def describe(self) -> str:
        return "; ".join(self.reasons) if self.run else "unchanged, skipped"


def config_values(spec: StageSpec, cfg_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The flat {dotted key: value} of every config value `spec` reads, minus its ignores."""
    flat: dict[str, Any] = {}
    for path in spec.reads:
        node: Any = cfg_dict
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(f"stage {spec.name} reads unknown config key {path!r}")
            node = node[part]
        flat.update(_flatten(path, node))
    return {k: v for k, v in flat.items()
            if not any(k == i or k.startswith(i + ".") for i in spec.ignores)}


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(f"{prefix}.{k}", v))
        return out
    return {prefix: value}


@lru_cache(maxsize=None)
def module_files(name: str) -> tuple[Path, ...]:
    """The source files of module or package `name` that its code hash covers."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise KeyError(f"stage code {name!r} is not an importable module or package")
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: every source file below it
        return tuple(sorted(p for p in origin.parent.rglob("*")
                            if p.suffix in (".py", ".json", ".jinja") and "__pycache__" not in p.parts))
    return (origin,)


def code_hashes(modules: Iterable[str]) -> dict[str, str]:
    """{module-relative file: hash[:12]} of the source files of `modules` (packages included).

    A Python file's hash is of its code, not its bytes (`code_hash`): docstrings, comments and
    formatting do not count, so editing them reruns nothing."""
    out: dict[str, str] = {}
    for name in modules:
        files = module_files(name)
        top = importlib.util.find_spec(name.split(".")[0])
        assert top is not None and top.origin is not None  # module_files found `name` under it
        root = Path(top.origin).parent.parent
        for path in files:
            out[str(path.relative_to(root))] = code_hash(path)
    return dict(sorted(out.items()))


_CODE_HASHES: dict[tuple[str, int, int], str] = {}
"""code_hash's cache: {(path, mtime_ns, size): hash} of files not modified in the last seconds."""

_RACY_NS = 2_000_000_000
"""A file modified less than this long ago is hashed afresh each time: within one tick of the
file system's clock an edit of the same size would leave (path, mtime_ns, size) unchanged."""


def code_hash(path: Path) -> str:
    """sha256[:12] of a `.py` file's normalised code (`normalised_code`), or of another file's bytes.

    A file that does not parse (a syntax error) falls back to its bytes."""
    stat = path.stat()
    key = (str(path), stat.st_mtime_ns, stat.st_size)
    if key in _CODE_HASHES:
        return _CODE_HASHES[key]
    data = path.read_bytes()
    if path.suffix == ".py":
        try:
            data = normalised_code(data, str(path)).encode()
        except (SyntaxError, ValueError):
            log.debug("%s does not parse; its code hash is of its bytes", path)
    digest = hashlib.sha256(data).hexdigest()[:12]
    if time.time_ns() - stat.st_mtime_ns > _RACY_NS:
        _CODE_HASHES[key] = digest
    return digest


def normalised_code(source: str | bytes, filename: str = "<source>") -> str:
    """The code of Python `source` without what does not change what it does: its AST's dump
    (no line numbers) with the docstrings of the module, classes and functions removed; comments
    and formatting are not in an AST. Raises SyntaxError when `source` does not parse."""
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                # a class or def needs a body; a module may be empty (as an empty __init__.py)
                node.body = body[1:] or ([] if isinstance(node, ast.Module) else [ast.Pass()])
    return ast.dump(tree, annotate_fields=True, include_attributes=False)


def stage_inputs(spec: StageSpec, cfg_dict: Mapping[str, Any],
                 upstream: Mapping[str, Upstream], extra: Mapping[str, Any] | None = None) -> StageInputs:
    """The inputs of one call of `spec` (upstream artifacts by role)."""
    unknown = set(upstream) - set(spec.input_names)
    if unknown:
        raise KeyError(f"stage {spec.name} declares no inputs {sorted(unknown)} (it has {spec.input_names})")
    return StageInputs(spec.job or spec.name, config_values(spec, cfg_dict), dict(upstream),
                       code_hashes(spec.code), dict(extra or {}))


def _contract(out_dir: Path) -> dict[str, Any]:
    contract = read_manifest(out_dir).get("contract")
    if not isinstance(contract, dict) or contract.get("version") != CONTRACT_VERSION:
        raise StageError(
            f"{out_dir} was written by an older peftbd (its manifest.json has no stage contract "
            f"v{CONTRACT_VERSION}), so nothing can tell whether it matches this config; delete it "
            f"(rm -r {out_dir}) or rerun its stage with --force"
        )
    return contract


def decide(inputs: StageInputs, out_dir: str | Path, force: bool = False) -> Decision:
    """Whether the stage must (re)build `out_dir` for `inputs`, with the reasons.

    Raises `StageError` for an output from an older layout, unless `force`.
    """
    out_dir = Path(out_dir)
    if force:
        return Decision(True, ("forced",))
    if not is_complete(out_dir):
        return Decision(True, ("no finished output yet",))
    old = _contract(out_dir)
    reasons = []
    if old.get("stage") != inputs.stage:
        reasons.append(f"the output belongs to stage {old.get('stage')!r}")
    reasons += _changes("config", old.get("config", {}), inputs.config)
    for role, new in inputs.upstream.items():
        was = old.get("upstream", {}).get(role)
        if was is None or was["fingerprint"] != new.fingerprint:
            reasons.append(f"input {role} changed")
        elif was["run_id"] != new.run_id:
            reasons.append(f"input {role} was rebuilt")
    reasons += [f"input {role} no longer used" for role in old.get("upstream", {})
                if role not in inputs.upstream]
    code_changed = sorted(k for k in set(old.get("code", {})) | set(inputs.code)
                          if old.get("code", {}).get(k) != inputs.code.get(k))
    if code_changed:
        more = f" (+{len(code_changed) - 3} more)" if len(code_changed) > 3 else ""
        reasons.append(f"code changed: {', '.join(code_changed[:3])}{more}")
    reasons += _changes("", old.get("extra", {}), inputs.extra)
    if not reasons and old["fingerprint"] != inputs.fingerprint:
        reasons.append("fingerprint changed")
    return Decision(bool(reasons), tuple(reasons))


def _changes(what: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    keys = sorted(k for k in set(old) | set(new) if old.get(k, _MISSING) != new.get(k, _MISSING))
    if not keys:
        return []
    shown = [_change(k, _show(old.get(k, _MISSING)), _show(new.get(k, _MISSING))) for k in keys[:4]]
    more = f" (+{len(keys) - 4} more)" if len(keys) > 4 else ""
    return [f"{what + ' ' if what else ''}{', '.join(shown)}{more}"]


def _change(key: str, old: str, new: str) -> str:
    """`key old -> new`, or `key changed` when the shortened values look the same (a content hash)."""
    return f"{key} changed" if old == new else f"{key} {old} -> {new}"


_MISSING = object()


def _show(value: Any) -> str:
    if value is _MISSING:
        return "(none)"
    text = json.dumps(value, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


Build = Callable[[Path, StageInputs], dict[str, Any]]
"""Writes a stage's files into the temporary output dir; returns its manifest sections."""


def run_stage(inputs: StageInputs, out_dir: str | Path, build: Build, cfg_dict: Mapping[str, Any],
              force: bool = False, decision: Decision | None = None) -> Decision:
    """Build `out_dir` unless `decide` says its output is current; returns the decision. The
    output's lock (`peftbd.output_lock`) is held throughout: a second run into `out_dir` fails at
    once with `OutputLockError`, naming this one.

    `build(tmp, inputs)` writes into the `.partial` sibling; its returned sections (`run_id` among them
    to pin the artifact's identity, e.g. a content hash) go into `manifest.json`, written last
    with the contract, config, versions, wall time and peak memory (sections may refine these).
    """
    with output_lock(out_dir):
        decision = decision or decide(inputs, out_dir, force)
        if not decision.run:
            log.info("%s: %s is current, skipped", inputs.stage, out_dir)
            return decision
        log.info("%s: building %s (%s)", inputs.stage, out_dir, decision.describe())
        timer = StageTimer()
        with atomic_output_dir(out_dir) as tmp:
            sections = build(tmp, inputs)
            run_id = sections.pop("run_id", None) or uuid.uuid4().hex[:16]
            write_manifest(tmp, {
                "stage": inputs.stage, **timer.stats(), **sections,
                "contract": {**inputs.record(), "run_id": run_id, "reasons": list(decision.reasons)},
                "config": dict(cfg_dict), "versions": versions(),
            })
    return decision


@dataclass(frozen=True)
class StageCall:
    """One call of a stage: its config, output dir, upstream artifact dirs (by stage name), extra
    inputs and the build. The main job plans a list of these; a stage job runs one."""

    spec: StageSpec
    cfg_dict: Mapping[str, Any]
    out: Path
    upstream: Mapping[str, Path]
    build: Build
    extra: Mapping[str, Any] = field(default_factory=dict)

    def inputs(self) -> StageInputs:
        """The inputs as they stand now (upstream manifests read afresh)."""
        producers = {s.name: s for s in self.spec.inputs}
        ups = {name: Upstream.of(path, producers.get(name), self.spec.name)
               for name, path in self.upstream.items()}
        return stage_inputs(self.spec, self.cfg_dict, ups, self.extra)

    def decide(self, force: bool = False) -> Decision:
        return decide(self.inputs(), self.out, force)

    def run(self, force: bool = False, decision: Decision | None = None) -> Decision:
        return run_stage(self.inputs(), self.out, self.build, self.cfg_dict, force, decision)


def lineage(upstream: Mapping[str, str | Path]) -> dict[str, Path]:
    """{stage name: artifact dir} of `upstream` and, recursively, of the artifacts each was
    built from (as their manifests record them)."""
    out: dict[str, Path] = {}
    todo = list(upstream.items())
    while todo:
        name, path = todo.pop()
        if name in out or not is_complete(path):
            continue
        out[name] = Path(path)
        contract = read_manifest(path).get("contract") or {}
        todo += [(k, v["path"]) for k, v in contract.get("upstream", {}).items()]
    return out
