"""The embedded instruction corpus: TULU-3-schema conversations built from prose shipped with Python.

Sources are `pydoc_data.topics` (the language reference, ~465 kB of English) and the docstrings of
a fixed list of standard-library modules. Tasks mix open-ended answers (explain, describe,
continue) with predictable ones (repeat, count, list), so a drafter trained on the verifier's
continuations is neither trivially always right nor never.
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
from typing import Any

import pydoc_data.topics

STDLIB_MODULES = (
    "abc", "argparse", "array", "ast", "asyncio", "base64", "binascii", "bisect", "bz2",
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


def _docstrings() -> list[tuple[str, str]]:
    """(qualified name, first docstring paragraph) for public members of STDLIB_MODULES."""
    pairs = []
    for mod_name in STDLIB_MODULES:
        try:
            module = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name in sorted(vars(module)):
            if name.startswith("_"):
                continue
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj) or inspect.isbuiltin(obj)):
                continue
            doc = inspect.getdoc(obj) or ""
            para = _clean(doc.split("\n\n")[0])
            if len(para) >= 40 and "\n" not in para and not para.startswith(name + "("):
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
    for qualname, para in _docstrings():
        answer = _clip(_sentences(para) or [para], 200)
        module, name = qualname.rsplit(".", 1)
        rows.append((f"What does `{qualname}` do?", answer))
        rows.append((f"Describe {name} from the {module} module.", answer))
        rows.append((f"Give a one-line description of `{qualname}`.", answer))
    words = sorted({w.lower() for _, p in _docstrings()[:400] for w in re.findall(r"[a-zA-Z]{4,9}", p)})
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
