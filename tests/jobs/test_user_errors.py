"""Every user error is one line: each `UserError` subclass (`peftbd.errors`), raised where a job's
command line does its work, directly or through Ray's wrappers, ends that command with exactly
`error: <message>` (status 1) and no traceback; any other error still propagates.

The classes are found by `UserError.__subclasses__()` after importing every project module, the
commands by the `if __name__ == "__main__":` of every project file: a new class or a new command
is covered (or must be listed in `NOT_USER_COMMANDS` with why) without editing this file.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from peftbd.errors import USER_ERRORS, UserError, error_line, one_line, user_error

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("peftbd", "jobs", "serve_apps")
COMMAND_DIRS = (*PACKAGES, "scripts")

Runner = tuple[str, str, Callable[[Any, list[str]], None], Callable[[Path], list[str]]]
"""(module, attribute): what the command's main calls first in its try-block, patched to raise;
how to call its main; its argv in a temporary directory."""


def _main(mod: Any, argv: list[str]) -> None:
    mod.main(argv)


def _out(tmp: Path) -> list[str]:
    return ["--out", str(tmp / "out"), "-v"]


COMMANDS: dict[str, Runner] = {
    # command module: (module whose attribute main calls first, that attribute, call, argv)
    "jobs.pipeline": ("jobs.pipeline", "run_pipeline", _main,
                      lambda tmp: ["--out", str(tmp / "root"), "-v"]),
    "jobs.generate": ("jobs.generate", "generate_call", _main, _out),
    "jobs.train": ("jobs.train", "train_call", _main,
                   lambda tmp: ["--method", "peftbd", *_out(tmp), "--data", str(tmp / "data")]),
    "jobs.recipe_ablation": ("jobs.recipe_ablation", "ablation_call", _main,
                             lambda tmp: [*_out(tmp), "--artifacts", str(tmp / "root")]),
    "jobs.acceptance_study": ("jobs.acceptance_study", "study_call", _main,
                              lambda tmp: [*_out(tmp), "--artifacts", str(tmp / "root")]),
    "jobs.cost_profile": ("jobs.cost_profile", "cost_profile_call", _main, _out),
    "jobs.benchmark": ("jobs.benchmark", "benchmark_call", _main,
                       lambda tmp: [*_out(tmp), "--artifacts", str(tmp / "artifacts")]),
    "jobs.placement": ("jobs.placement", "placement_call", _main, _out),
    "jobs.placement_sim": ("jobs.placement_sim", "measured_reports", _main,
                           lambda tmp: ["--out", str(tmp / "out")]),
    "jobs.generate_bench": ("jobs.generate_bench", "run_bench", _main,
                            lambda tmp: ["--out", str(tmp / "out")]),
    "jobs.peer": ("jobs.peer", "peer_call", _main, _out),
    "jobs.ahead_study": ("jobs.ahead_study", "run_study", _main,
                         lambda tmp: ["--out", str(tmp / "out")]),
    "peftbd.benchmarking.engine_speed": ("peftbd.benchmarking.engine_speed", "speed_call",
                                         _main, _out),
    "peftbd.analysis.readme_table": ("peftbd.analysis.readme_table", "update_readme", _main,
                                     lambda tmp: [str(tmp / "root"), "--readme", str(tmp / "README.md")]),
}
NOT_USER_COMMANDS = {
    "peftbd.oracle": "takes numbers, no config, output or Ray: a bad one is argparse's usage error",
    "peftbd.budgets": "prints the budget lines, no config, output or Ray: an unreadable ledger is "
                      "one of its lines, not an error",
    "peftbd.tiny_world.refresh": "a maintainer's rebuild of the shipped world from the tiny recipe",
    "scripts.device_check": "a developer's GPU check on a borrowed device (no Ray, no stage)",
    "jobs.local_cluster": "starts a local two-node Ray cluster; no config, output or stage: a "
                          "node that fails is one line (NodeError)",
    "peftbd.peers.vllm_side": "vLLM's side process, started by VllmPeer: a failure is its reply "
                              "(Failed), raised by the caller as VllmError",
}
MIN_COMMANDS, MIN_CLASSES = 11, 11
"""What was found when this test was written: fewer means discovery broke, not that all passed."""


def _import_all() -> None:
    for name in PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(info.name)


def _user_errors() -> dict[str, type[UserError]]:
    """Every project subclass of `UserError` (not Ray's wrappers of them, made at run time)."""
    _import_all()
    found, todo = {}, [UserError]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.split(".")[0] in PACKAGES:
                found[sub.__name__] = sub
    return found


def _commands() -> set[str]:
    """Every project file with an `if __name__ == "__main__":` block, as a module name."""
    found = set()
    for top in COMMAND_DIRS:
        for path in (REPO / top).rglob("*.py"):
            for node in ast.parse(path.read_text()).body:
                if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
                        and ast.unparse(node.test) in ('__name__ == "__main__"', "__name__ == '__main__'")):
                    found.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


USER_ERROR_CLASSES = _user_errors()


def _run(command: str, tmp_path: Path, monkeypatch, raise_: Callable[[], BaseException]):
    """Run `command`'s main with its first step raising `raise_()`; the SystemExit or error."""
    module, attr, call, argv = COMMANDS[command]

    def fail(*_args: Any, **_kwargs: Any) -> Any:
        raise raise_()

    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(importlib.import_module(module), attr, fail)
    return call(importlib.import_module(command), argv(tmp_path))


def _assert_one_line(exc: SystemExit, message: str, capsys) -> None:
    assert exc.code == f"error: {message}", exc.code
    assert "\n" not in exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err and message not in err, err[-2000:]


def test_discovery_finds_at_least_what_there_was():
    assert len(USER_ERROR_CLASSES) >= MIN_CLASSES, sorted(USER_ERROR_CLASSES)
    assert _commands() == set(COMMANDS) | set(NOT_USER_COMMANDS), (
        "a new command: add it to COMMANDS (what its main calls first) or NOT_USER_COMMANDS")
    assert len(COMMANDS) >= MIN_COMMANDS


@pytest.mark.parametrize("cls_name", sorted(USER_ERROR_CLASSES))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_user_error_ends_every_command_in_one_line(command, cls_name, tmp_path, monkeypatch,
                                                        capsys):
    message = f"{cls_name} from {command}: set some.key=2 to fix it"
    with pytest.raises(SystemExit) as err:
        _run(command, tmp_path, monkeypatch, lambda: USER_ERROR_CLASSES[cls_name](message))
    _assert_one_line(err.value, message, capsys)


def _ray_task_error(cause: BaseException) -> BaseException:
    """What `ray.get` raises for a task that raised `cause`: its text is the worker's traceback."""
    from ray.exceptions import RayTaskError

    return RayTaskError("run_shard", f"Traceback (most recent call last):\n  File \"w.py\"\n{cause!r}",
                        cause).as_instanceof_cause()


def _worker_group_error(cause: BaseException) -> BaseException:
    """What Ray Train's `Trainer.fit` raises when a worker raised `cause`."""
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import WorkerGroupError

    return WorkerGroupError("Training failed", {1: UserExceptionWithTraceback(cause, "Traceback\n...")})


def _user_code_error(cause: BaseException) -> BaseException:
    """Ray Data's wrapper of a map function's error, as raised where the function ran."""
    from ray.exceptions import UserCodeException

    try:
        raise UserCodeException("UDF failed to process a data block.") from cause
    except UserCodeException as exc:
        return exc


WRAPPERS = {"ray_task": _ray_task_error, "train_worker": _worker_group_error,
            "data_udf": _user_code_error}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_user_error_through_ray_is_its_own_line(command, wrapper, tmp_path, monkeypatch, capsys):
    cls_name = sorted(USER_ERROR_CLASSES)[sorted(COMMANDS).index(command) % len(USER_ERROR_CLASSES)]
    message = f"{cls_name} in a Ray worker of {command}: set some.key=2"
    wrapped = WRAPPERS[wrapper](USER_ERROR_CLASSES[cls_name](message))
    assert str(wrapped) != message  # Ray's text: a traceback, or its own words
    with pytest.raises(SystemExit) as err:
        _run(command, tmp_path, monkeypatch, lambda: wrapped)
    _assert_one_line(err.value, message, capsys)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_message_of_several_lines_becomes_one(command, tmp_path, monkeypatch, capsys):
    cls = USER_ERROR_CLASSES["ConfigError"]
    with pytest.raises(SystemExit) as err:
        _run(command, tmp_path, monkeypatch, lambda: cls("some.key=1 is wrong\n  set some.key=2\n"))
    _assert_one_line(err.value, "some.key=1 is wrong; set some.key=2", capsys)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_any_other_error_is_not_hidden(command, tmp_path, monkeypatch):
    """A bug keeps its traceback: only user errors are shortened to one line."""
    with pytest.raises(KeyError, match="a bug"):
        _run(command, tmp_path, monkeypatch, lambda: KeyError("a bug"))
    with pytest.raises(Exception) as err:  # a bug in a Ray task stays Ray's error
        _run(command, tmp_path, monkeypatch, lambda: _ray_task_error(KeyError("a bug")))
    assert isinstance(err.value, KeyError) and user_error(err.value) is None


@pytest.mark.parametrize(("setting", "message"), [
    # passes loading; the benchmark's speculative rounds start at the second token
    ("decoding.max_new_tokens=1", "error: decoding.max_new_tokens=1: need >= 2, since prefill commits "
     "the first token and speculative rounds start with the second"),
    # passes loading; the profiled architecture's depth is known while planning
    ("cost_profile.early_exit_layers=99", "error: cost_profile.early_exit_layers=99: Qwen/Qwen3-0.6B "
     "has 28 layers; use 1..27, or 0 for no early-exit arm"),
])
def test_a_setting_refused_while_planning_stops_the_main_job_in_one_line(setting, message, tmp_path,
                                                                         monkeypatch, capsys):
    """The real main job (a dry run: planning only, nothing built), refused before any stage."""
    from jobs.pipeline import main

    monkeypatch.setenv("PEFTBD_CACHE", str(tmp_path / "cache"))
    with pytest.raises(SystemExit) as err:
        main(["--set", setting, "--dry-run", "--out", str(tmp_path / "root")])
    assert err.value.code == message
    assert "Traceback" not in capsys.readouterr().err
    assert not (tmp_path / "cache").exists() and not (tmp_path / "root" / "continuations").exists()


@pytest.mark.parametrize("command", ["jobs.cost_profile", "jobs.placement"])
def test_the_jobs_that_also_print_a_plain_value_error_do_so_in_one_line(command, tmp_path,
                                                                        monkeypatch, capsys):
    for raise_ in (lambda: ValueError("some.key=1\nuse 2"),
                   lambda: _ray_task_error(ValueError("some.key=1\nuse 2"))):
        with pytest.raises(SystemExit) as err:
            _run(command, tmp_path, monkeypatch, raise_)
        _assert_one_line(err.value, "some.key=1; use 2", capsys)


@pytest.mark.parametrize("cls_name", sorted(USER_ERROR_CLASSES))
def test_every_user_error_is_listed_importable_and_keeps_its_older_base(cls_name):
    cls = USER_ERROR_CLASSES[cls_name]
    assert USER_ERRORS.get(cls_name) == cls.__module__, "list it in peftbd.errors.USER_ERRORS"
    assert getattr(importlib.import_module(cls.__module__), cls_name) is cls
    assert issubclass(cls, (ValueError, RuntimeError)), "keep its older base (except ValueError ...)"
    assert f"`{cls_name}` ({cls.__module__})" in importlib.import_module("peftbd.errors").__doc__


def test_the_list_names_no_class_that_is_gone():
    assert set(USER_ERRORS) == set(USER_ERROR_CLASSES)


def test_the_contract_is_documented_and_internal_errors_stay_out():
    import peftbd.errors as errors

    doc = " ".join(errors.__doc__.split())
    for words in ("one line", "names the key", "error: <message>", "no traceback", "exit status 1",
                  "user can fix", "except ValueError"):
        assert words in doc, words
    for words in ("one line", "names the key", "error: <message>", "no traceback"):
        assert words in " ".join(UserError.__doc__.split()), words
    for name in ("BackendUnavailable", "RequestError", "BadRow"):  # decided: not user errors
        assert name in doc and name not in USER_ERROR_CLASSES
    from peftbd.data.chat import BadRow
    from peftbd.serving.validation import RequestError
    from serve_apps.backends import BackendUnavailable

    assert not issubclass(BadRow, UserError) and not issubclass(RequestError, UserError)
    assert not issubclass(BackendUnavailable, UserError)


def test_the_errors_module_imports_nothing():
    tree = ast.parse((REPO / "peftbd" / "errors.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(n) for n in imports] == ["from __future__ import annotations"]


def test_one_line_and_error_line():
    assert one_line("a\n\n  b  \nc") == "a; b; c"
    assert error_line(USER_ERROR_CLASSES["StageError"]("x\ny")) == "error: x; y"
    assert user_error(ValueError("x")) is None
