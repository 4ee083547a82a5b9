"""A stage's code fingerprint follows its code, not its bytes: docstrings, comments and
formatting do not count; any change to what the code does does."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import time
from pathlib import Path

import pytest

from peftbd.stage import StageSpec, code_hash, code_hashes, decide, run_stage, stage_inputs

ORIGINAL = '''\
"""A module docstring."""

import math

LIMIT = 3


class Scaler:
    """A class docstring."""

    factor = 2

    def scale(self, x, *, offset=0):
        """A method docstring."""
        return x * self.factor + offset


def total(values):
    """A function docstring."""
    acc = 0
    for v in values:
        acc += v
    return min(acc, LIMIT)


async def later(x):
    """An async def docstring."""
    return math.floor(x)


def only_a_docstring():
    """Nothing but this."""
'''

SAME_CODE = {
    "docstrings edited": '''\
"""Another module docstring,
over two lines."""

import math

LIMIT = 3


class Scaler:
    """Another class docstring."""

    factor = 2

    def scale(self, x, *, offset=0):
        \'\'\'Another method docstring.\'\'\'
        return x * self.factor + offset


def total(values):
    "Another function docstring."
    acc = 0
    for v in values:
        acc += v
    return min(acc, LIMIT)


async def later(x):
    """Another async def docstring."""
    return math.floor(x)


def only_a_docstring():
    """Still nothing but this, reworded."""
''',
    "docstrings removed": '''\
import math

LIMIT = 3


class Scaler:
    factor = 2

    def scale(self, x, *, offset=0):
        return x * self.factor + offset


def total(values):
    acc = 0
    for v in values:
        acc += v
    return min(acc, LIMIT)


async def later(x):
    return math.floor(x)


def only_a_docstring():
    pass
''',
    "comments": ORIGINAL.replace("LIMIT = 3", "# the cap\nLIMIT = 3  # was 3 before too")
                        .replace("    acc = 0", "    # sum them up\n    acc = 0"),
    "reformatted": '''\
"""A module docstring."""
import math
LIMIT = (3)



class Scaler:
    """A class docstring."""
    factor = 2
    def scale(self,
              x,
              *,
              offset=0,
              ):
        """A method docstring."""
        return (x * self.factor
                + offset)


def total(values):
    """A function docstring."""
    acc = 0
    for v in values: acc += v
    return min(
        acc,
        LIMIT,
    )
async def later(x):
    """An async def docstring."""
    return math.floor(
        x)


def only_a_docstring(): """Nothing but this."""
''',
}

OTHER_CODE = {
    "a changed constant": ORIGINAL.replace("LIMIT = 3", "LIMIT = 4"),
    "a changed default": ORIGINAL.replace("offset=0", "offset=1"),
    "a renamed variable": ORIGINAL.replace("acc", "running"),
    "an added statement": ORIGINAL.replace("    acc = 0\n", "    acc = 0\n    values = list(values)\n"),
    "a removed statement": ORIGINAL.replace("import math\n", ""),
    "a body given to a docstring-only def": ORIGINAL.replace(
        '    """Nothing but this."""\n', '    """Nothing but this."""\n    return 1\n'),
    "a string that is no docstring": ORIGINAL.replace("    acc = 0\n", '    acc = 0\n    "not a docstring"\n'),
}

_ids = itertools.count()


@pytest.fixture
def package(tmp_path, monkeypatch):
    """`make(source) -> (package name, core.py path)`: an importable temporary package whose
    `core` module holds `source` (a fresh package name each call, so no finder cache is stale)."""
    root = tmp_path / "src"
    monkeypatch.syspath_prepend(str(root))

    def make(source: str) -> tuple[str, Path]:
        name = f"probe_pkg_{os.getpid()}_{next(_ids)}"
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text('"""A probe package."""\n')
        core = root / name / "core.py"
        core.write_text(source)
        importlib.invalidate_caches()
        return name, core

    return make


def _edit(path: Path, source: str) -> None:
    """Rewrites `path`, its mtime moved on as a later edit's would be."""
    before = path.stat().st_mtime_ns
    path.write_text(source)
    os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_the_original_source_is_valid_python_and_its_hash_has_the_contracts_shape(package):
    name, core = package(ORIGINAL)
    hashes = code_hashes([f"{name}.core", name])
    assert set(hashes) == {f"{name}/__init__.py", f"{name}/core.py"}
    assert all(len(h) == 12 and set(h) <= set("0123456789abcdef") for h in hashes.values())
    module = importlib.import_module(f"{name}.core")
    assert module.total([1, 1, 5]) == 3 and module.Scaler().scale(2) == 4


@pytest.mark.parametrize("edit", sorted(SAME_CODE))
def test_docstring_comment_and_formatting_edits_leave_the_hash_unchanged(package, edit):
    name, core = package(ORIGINAL)
    before = code_hashes([f"{name}.core"])
    _edit(core, SAME_CODE[edit])
    compile(SAME_CODE[edit], str(core), "exec")  # the edit is valid Python
    assert code_hashes([f"{name}.core"]) == before, edit


@pytest.mark.parametrize("edit", sorted(OTHER_CODE))
def test_code_edits_change_the_hash(package, edit):
    assert OTHER_CODE[edit] != ORIGINAL, "the edit must apply"
    name, core = package(ORIGINAL)
    before = code_hashes([f"{name}.core"])
    _edit(core, OTHER_CODE[edit])
    compile(OTHER_CODE[edit], str(core), "exec")
    assert code_hashes([f"{name}.core"]) != before, edit


def test_an_empty_init_and_a_docstring_only_init_hash_alike(package):
    name, _ = package(ORIGINAL)
    init = code_hashes([name])[f"{name}/__init__.py"]
    _edit(Path(importlib.util.find_spec(name).origin), "")
    assert code_hashes([name])[f"{name}/__init__.py"] == init


def test_other_files_keep_their_byte_hash(tmp_path):
    data = tmp_path / "template.jinja"
    data.write_text("{{ x }}\n")
    before = code_hash(data)
    data.write_text("{{ x }} \n")  # bytes are all a non-Python file has
    assert code_hash(data) != before


def test_a_file_that_does_not_parse_is_hashed_by_its_bytes(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def broken(:\n")
    first = code_hash(bad)
    bad.write_text("def broken(: \n")
    assert code_hash(bad) != first


def test_the_cache_never_serves_an_edited_file(tmp_path):
    """Hashes of files untouched for a while are cached by (path, mtime, size); a same-size
    edit moves the mtime, and a file modified just now is never cached."""
    path = tmp_path / "mod.py"
    path.write_text("X = 1\n")
    old = time.time_ns() - 60 * 10**9
    os.utime(path, ns=(old, old))
    first = code_hash(path)
    assert code_hash(path) == first  # cached
    path.write_text("X = 2\n")  # the same size
    os.utime(path, ns=(old + 1, old + 1))
    assert code_hash(path) != first
    path.write_text("X = 3\n")  # the same size, just now: hashed afresh on every call
    third = code_hash(path)
    path.write_text("X = 4\n")
    assert code_hash(path) != third


def test_stage_decisions_skip_docstring_edits_and_rerun_code_edits(package, tmp_path):
    name, core = package(ORIGINAL)
    spec = StageSpec("probe", "probe stage", "probe", reads=("a",), code=(f"{name}.core",))
    cfg = {"a": 1}
    out = tmp_path / "out"

    def build(tmp: Path, _inputs) -> dict:
        (tmp / "result.txt").write_text("done")
        return {}

    assert run_stage(stage_inputs(spec, cfg, {}), out, build, cfg).run
    assert not decide(stage_inputs(spec, cfg, {}), out).run

    _edit(core, SAME_CODE["docstrings edited"])
    decision = decide(stage_inputs(spec, cfg, {}), out)
    assert not decision.run and decision.describe() == "unchanged, skipped"

    _edit(core, SAME_CODE["comments"])
    assert not decide(stage_inputs(spec, cfg, {}), out).run

    _edit(core, OTHER_CODE["a changed constant"])
    decision = decide(stage_inputs(spec, cfg, {}), out)
    assert decision.run and decision.reasons == (f"code changed: {name}/core.py",)
