"""User errors: what the person running a job can fix, said in one line.

The contract of `UserError` (every job's command line keeps it):

1. Raise a `UserError` subclass for what the user can fix (a config key, an option, a path, a
   stale output), never for a bug in the code.
2. Its message is one line that names the key (config key, option or path) and the fix, e.g.
   `decoding.max_new_tokens=1: need >= 2, ...` or `... choose an --out on writable storage`.
3. Every job's command line (`jobs/*.py` `main`, `peftbd.cli.run_stage_job`, the other
   `python -m` commands) catches it, Ray's wrappers included (`user_error`), and exits through
   `sys.exit(error_line(exc))`: exactly one line `error: <message>` on stderr, exit status 1, no
   traceback. A config that does not load (`peftbd.cli.config_from_args`) prints the same line
   and exits with status 2, as argparse does.

Every user-facing error class subclasses `UserError` and keeps its older base (e.g.
`class ConfigError(UserError, ValueError)`), so `except ValueError` keeps catching it. The classes
(`USER_ERRORS` lists where each is defined; tests/jobs/test_user_errors.py checks the list
against `UserError.__subclasses__()` and sends each through every job's `main`):

- `ConfigError` (peftbd.config_merge): a config key or value that does not load or cannot work.
- `StageError` (peftbd.stage): an output or input the stage contract cannot vouch for.
- `OutputLockError` (peftbd.output_lock): an --out another run holds, or not writable.
- `PromptError` (peftbd.benchmarking.prompts): benchmark prompts that cannot be loaded.
- `ModelUnavailableError` (peftbd.models.sources): the configured model or tokenizer cannot load.
- `SourceError` (peftbd.data.sources): a `data.source` that names no readable source.
- `ArtifactError` (peftbd.data.artifact): an artifact directory or split file missing or malformed.
- `CheckpointMismatch` (peftbd.training.checkpoint): a checkpoint of another run's inputs or shapes.
- `BenchmarkInputError` (jobs.benchmark): a benchmark option or setting it cannot run with.
- `MixedPaths` (peftbd.benchmarking.forward_paths): arms whose forwards would be timed on
  different paths (`decoding.fast_path` while some draft stays eager).
- `CudaGraphsFellBack` (peftbd.benchmarking.forward_paths): `decoding.fast_path=true` on CUDA,
  and some arm's compiled forwards ran without CUDA graphs.
- `ResourcesUnavailable` (jobs.resources): the Ray cluster lacks what the job asks for.
- `ReadmeTableError` (peftbd.analysis.readme_table): no results to tabulate, or a README without
  its results markers.
- `VllmAbsent` (peftbd.peers.vllm_env): vLLM is not installed where the project looks for it.
- `DflashExportError` (peftbd.peers.dflash_export): a head vLLM's dflash format cannot hold.
- `PeerDeviceMismatch` (peftbd.benchmarking.peer_runs): vLLM's engine on another device than ours.

Not user errors: `serve_apps.backends.BackendUnavailable` (a replica that keeps dying: an HTTP
503 of the running server, no command line), `peftbd.serving.validation.RequestError` (a bad
HTTP request: its own 4xx response), `peftbd.data.chat.BadRow` (a source row that cannot become
a prompt: counted as a drop reason, never shown as an error).

This module imports nothing (peftbd/ must not import Ray): Ray's wrappers are recognised by
their attributes.
"""

from __future__ import annotations

USER_ERRORS: dict[str, str] = {
    "ConfigError": "peftbd.config_merge",
    "StageError": "peftbd.stage",
    "OutputLockError": "peftbd.output_lock",
    "PromptError": "peftbd.benchmarking.prompts",
    "ModelUnavailableError": "peftbd.models.sources",
    "SourceError": "peftbd.data.sources",
    "ArtifactError": "peftbd.data.artifact",
    "VllmAbsent": "peftbd.peers.vllm_env",
    "DflashExportError": "peftbd.peers.dflash_export",
    "PeerDeviceMismatch": "peftbd.benchmarking.peer_runs",
    "CheckpointMismatch": "peftbd.training.checkpoint",
    "BenchmarkInputError": "jobs.benchmark",
    "MixedPaths": "peftbd.benchmarking.forward_paths",
    "CudaGraphsFellBack": "peftbd.benchmarking.forward_paths",
    "ResourcesUnavailable": "jobs.resources",
    "ReadmeTableError": "peftbd.analysis.readme_table",
}
"""Every user-facing error class: its name -> the module that defines it."""


class UserError(Exception):
    """An error the user can fix. Its message is one line that names the key (config key, option
    or path) and the fix; every job's command line prints it as the one line `error: <message>`
    (exit status 1; 2 for a config that does not load) with no traceback. Subclasses keep their
    older base too (`class ConfigError(UserError, ValueError)`)."""


def one_line(text: str) -> str:
    """`text` on one line: its lines, stripped and without blank ones, joined by '; '."""
    return "; ".join(line.strip() for line in str(text).splitlines() if line.strip())


def user_error(exc: BaseException) -> UserError | None:
    """The `UserError` behind `exc`, else None: `exc` itself, or the one a Ray wrapper carries:
    `RayTaskError.cause` (`ray.get` of a task or actor call that raised it; its own text is the
    worker's traceback), Ray Train's `_base_exc` (a worker's error as raised) and
    `worker_failures` (a failed worker group), Ray Data's `UserCodeException` (`__cause__`: the
    error of a map function)."""
    return _find(exc, set())


def _find(err: BaseException, seen: set[int]) -> UserError | None:
    if id(err) in seen:
        return None
    seen.add(id(err))
    for inner in _wrapped(err):
        if (found := _find(inner, seen)) is not None:
            return found
    return err if isinstance(err, UserError) else None


def _wrapped(err: BaseException) -> list[BaseException]:
    """What a Ray wrapper `err` wraps; [] when `err` is no wrapper."""
    found: list[BaseException] = []
    for name in ("cause", "_base_exc"):  # RayTaskError; Ray Train's UserExceptionWithTraceback
        inner = _own_attribute(err, name)
        if isinstance(inner, BaseException) and inner is not err:
            found.append(inner)
    failures = _own_attribute(err, "worker_failures")  # Ray Train's WorkerGroupError
    if isinstance(failures, dict):
        found += [f for f in failures.values() if isinstance(f, BaseException)]
    if type(err).__name__.endswith("UserCodeException") and err.__cause__ is not None:
        found.append(err.__cause__)  # Ray Data: raise UserCodeException(...) from the UDF's error
    return found


def _own_attribute(err: BaseException, name: str) -> object:
    """`err`'s attribute `name` if it has one of its own (a RayTaskError dual of a cause class
    forwards unknown attributes to the cause: those are not its own)."""
    try:
        return vars(err).get(name)
    except TypeError:
        return None


def error_line(exc: UserError) -> str:
    """The line a job's command line exits with: `error: <message>`, on one line."""
    return f"error: {one_line(str(exc))}"
