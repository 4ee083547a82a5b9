"""The embedded instruction corpus: TULU-3-schema conversations built from prose shipped with Python.

Sources are `pydoc_data.topics` (the language reference, ~465 kB of English) and the docstrings of
a fixed list of standard-library modules. Tasks mix open-ended answers (explain, describe,
continue) with predictable ones (repeat, count, list), so a drafter trained on the verifier's
continuations is neither trivially always right nor never.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import random
import re
from typing import Any

import pydoc_data.topics

STDLIB_MODULES = (
    "abc", "argparse", "builtins", "array", "ast", "asyncio", "base64", "binascii", "bisect", "bz2",
    "calendar", "cmd", "codecs", "collections", "colorsys", "concurrent.futures", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis",
    "doctest", "email", "enum", "filecmp", "fnmatch", "fractions", "functools", "gettext", "glob",
    "graphlib", "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http.client",
    "inspect", "io", "ipaddress", "itertools", "json", "keyword", "locale", "logging", "lzma",
    "math", "mimetypes", "operator", "os", "os.path", "pathlib", "pickle", "platform", "pprint",
    "queue", "random", "re", "sched", "secrets", "selectors", "shelve", "shlex", "shutil",
    "signal", "socket", "sqlite3", "stat", "statistics", "string", "struct", "subprocess",
    "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "tokenize", "traceback",
    "types", "typing", "unicodedata", "unittest", "urllib.parse", "uuid", "warnings", "wave",
    "weakref", "xml.etree.ElementTree", "zipfile", "zlib", "zoneinfo",
)

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant that answers questions about Python.",
    "Answer briefly and precisely.",
)

NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty"
).split()

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(_clean(text)) if len(s) > 20]


def _clip(sentences: list[str], max_chars: int) -> str:
    out: list[str] = []
    for s in sentences:
        if out and len(" ".join(out + [s])) > max_chars:
            break
        out.append(s)
    return " ".join(out)[: max_chars * 2]


def _topic_paragraphs() -> list[tuple[str, str]]:
    """(topic, paragraph) pairs of prose from the language reference, code blocks dropped."""
    pairs = []
    for topic in sorted(pydoc_data.topics.topics):
        for block in pydoc_data.topics.topics[topic].split("\n\n"):
            if block.startswith((" ", "*", "=", "-")) or len(block) < 120:
                continue
            pairs.append((topic, _clean(block)))
    return pairs


def _source_docs(path: str) -> list[tuple[str, str]]:
    """(name, docstring) of top-level functions, classes and methods, parsed from source."""
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    tree = ast.parse(open(path, encoding="utf-8").read())
    docs = []
    for node in tree.body:
        if isinstance(node, defs):
            docs.append((node.name, ast.get_docstring(node) or ""))
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            docs += [
                (f"{node.name}.{item.name}", ast.get_docstring(item) or "")
                for item in node.body
                if isinstance(item, defs) and not item.name.startswith("_")
            ]
    return docs


def _builtin_docs(module_name: str) -> list[tuple[str, str]]:
    """(name, docstring) of the builtins and classes of a C extension module."""
    module = importlib.import_module(module_name)
    return [
        (name, inspect.getdoc(obj) or "")
        for name, obj in vars(module).items()
        if inspect.isbuiltin(obj) or inspect.isclass(obj)
    ]


def _docstrings() -> list[tuple[str, str]]:
    """(qualified name, first docstring paragraph) for public members of STDLIB_MODULES.

    Python modules are parsed from source rather than imported, so the corpus does not depend
    on what the process imported or monkeypatched before (torch patches `inspect`).
    """
    pairs = []
    for mod_name in STDLIB_MODULES:
        spec = importlib.util.find_spec(mod_name)
        if spec is None:
            continue
        origin = spec.origin or ""
        docs = _source_docs(origin) if origin.endswith(".py") else _builtin_docs(mod_name)
        for name, doc in sorted(docs):
            para = _clean(doc.split("\n\n")[0])
            if name.startswith("_") or len(para) < 40 or para.startswith(name + "("):
                continue
            pairs.append((f"{mod_name}.{name}", para))
    return pairs


def _messages(user: str, answer: str, rng: random.Random) -> list[dict[str, str]]:
    msgs = []
    if rng.random() < 0.2:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    msgs.append({"role": "user", "content": user})
    msgs.append({"role": "assistant", "content": answer})
    return msgs


def _task_rows(rng: random.Random) -> list[tuple[str, str]]:
    """All candidate (user, answer) pairs, in a deterministic order."""
    docstrings = _docstrings()
    rows: list[tuple[str, str]] = []
    seen_topics: set[str] = set()
    for topic, para in _topic_paragraphs():
        sents = _sentences(para)
        if not sents:
            continue
        if topic not in seen_topics:
            seen_topics.add(topic)
            rows.append((f"Explain the Python topic '{topic}'.", _clip(sents, 220)))
        if len(sents) >= 2:
            rows.append((f"Continue the text: {sents[0]}", _clip(sents[1:], 220)))
            rows.append((f"Summarize in one sentence: {_clip(sents, 400)}", sents[0]))
    for qualname, para in docstrings:
        answer = _clip(_sentences(para) or [para], 200)
        module, name = qualname.rsplit(".", 1)
        rows.append((f"What does `{qualname}` do?", answer))
        rows.append((f"Describe {name} from the {module} module.", answer))
        rows.append((f"Give a one-line description of `{qualname}`.", answer))
    words = sorted({w.lower() for _, p in docstrings[:400] for w in re.findall(r"[a-zA-Z]{4,9}", p)})
    for _ in range(300):
        picked = rng.sample(words, rng.randint(3, 8))
        rows.append((f"Repeat these words: {' '.join(picked)}", " ".join(picked)))
        start = rng.randint(0, 12)
        stop = start + rng.randint(3, 8)
        rows.append((f"Count from {start} to {stop}.", ", ".join(str(i) for i in range(start, stop + 1)) + "."))
        n = rng.randint(2, 6)
        rows.append((f"Spell out the numbers from one to {NUMBER_WORDS[n]}.",
                     " ".join(NUMBER_WORDS[1 : n + 1]).capitalize() + "."))
    return rows


def build_corpus(seed: int, num_rows: int) -> list[dict[str, Any]]:
    """`num_rows` TULU-3-schema rows (`id`, `messages`, `source`), deterministic from `seed`."""
    rng = random.Random(seed)
    candidates = _task_rows(rng)
    rng.shuffle(candidates)
    if num_rows > len(candidates):
        raise ValueError(
            f"tiny_world.corpus_rows={num_rows} exceeds the {len(candidates)} conversations the "
            f"embedded sources yield; set tiny_world.corpus_rows <= {len(candidates)}"
        )
    return [
        {"id": f"embedded-{i:06d}", "messages": _messages(user, answer, rng), "source": "embedded"}
        for i, (user, answer) in enumerate(candidates[:num_rows])
    ]
