"""The embedded instruction corpus: TULU-3-schema conversations built from prose shipped with Python.

Sources are `pydoc_data.topics` (the language reference, ~465 kB of English) and the docstrings of
a fixed list of standard-library modules. About 2/3 of the answers are grounded in the
prompt's text (repeat a passage, list its sentences, turn a docstring into a reference entry),
the rest open-ended (explain a topic, continue a text, say what a function does) or structured
(repeat or number words, spell out numbers), so a drafter trained on the verifier's
continuations is neither trivially always right nor never. Answers run to a few hundred
characters (the paper's regime: replies of many D = 16 blocks), none shorter than ~40 tokens.
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
    "fifteen sixteen seventeen eighteen nineteen twenty twenty-one twenty-two twenty-three "
    "twenty-four twenty-five twenty-six twenty-seven twenty-eight twenty-nine thirty"
).split()
PROSE_MIN_CHARS = 160
"""Shortest prose answer kept (~40 tokens): replies in the paper's regime run for many blocks."""
PROMPT_MAX_CHARS = 1200
"""Longest user turn kept (~350 tokens), well inside the prompt limit (`data.max_prompt_len`)."""
PASSAGE_CHARS = 560
"""Passages and answers are clipped at about this many characters (~160 tokens)."""

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
    """(qualified name, docstring) for public members of STDLIB_MODULES.

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
            text = _clean(doc)
            if name.startswith("_") or len(text) < 40 or text.startswith(name + "("):
                continue
            pairs.append((f"{mod_name}.{name}", text))
    return pairs


def _messages(user: str, answer: str, rng: random.Random) -> list[dict[str, str]]:
    msgs = []
    if rng.random() < 0.2:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    msgs.append({"role": "user", "content": user})
    msgs.append({"role": "assistant", "content": answer})
    return msgs


def _grounded_rows(docstrings: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Answers grounded in the prompt's text: repeat a passage, list its sentences, turn a
    docstring into a reference entry. A small verifier learns to copy (induction) within the
    tiny budget, so its greedy replies stay long, varied text instead of degenerate loops."""
    rows: list[tuple[str, str]] = []
    for topic, sents in _topic_sentences():
        for i in range(0, len(sents), 2):
            passage = _clip(sents[i:], PASSAGE_CHARS)
            if len(passage) < PROSE_MIN_CHARS:
                continue
            rows.append((f"Repeat the following text: {passage}", passage))
            if i % 4 == 0:
                lines = _clip(sents[i:], PASSAGE_CHARS // 2 * 3).split(". ")
                rows.append((f"List the sentences of this text, one per line: {'. '.join(lines)}",
                             "\n".join(f"- {line.rstrip('.')}." for line in lines)))
    for qualname, doc in docstrings:
        answer = _clip(_sentences(doc) or [doc], PASSAGE_CHARS)
        if len(answer) >= PROSE_MIN_CHARS:
            module, name = qualname.rsplit(".", 1)
            rows.append((f"Turn this docstring of `{qualname}` into a reference entry: {answer}",
                         f"Name: {name}\nModule: {module}\nSummary: {answer}"))
    return rows


def _open_rows(docstrings: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Open-ended answers the verifier must recall: explain a topic, continue a text, say what
    a function does."""
    rows: list[tuple[str, str]] = []
    for topic, sents in _topic_sentences():
        rows.append((f"Explain the Python topic '{topic}'.", _clip(sents, PASSAGE_CHARS)))
        for i in range(1, len(sents) - 1, 8):
            if len(" ".join(sents[i:])) >= PROSE_MIN_CHARS:
                rows.append((f"Continue the text: {sents[i - 1]}", _clip(sents[i:], PASSAGE_CHARS)))
    for qualname, doc in docstrings:
        answer = _clip(_sentences(doc) or [doc], PASSAGE_CHARS)
        if len(answer) >= PROSE_MIN_CHARS:
            rows.append((f"What does `{qualname}` do?", answer))
    return rows


def _topic_sentences() -> list[tuple[str, list[str]]]:
    """(topic, its sentences) of the language reference with enough prose to answer from."""
    by_topic: dict[str, list[str]] = {}
    for topic, para in _topic_paragraphs():
        by_topic.setdefault(topic, []).extend(_sentences(para))
    return [(t, s) for t, s in sorted(by_topic.items()) if len(" ".join(s)) >= PROSE_MIN_CHARS]


def _structured_rows(words: list[str], rng: random.Random, n: int) -> list[tuple[str, str]]:
    """Long answers that follow from the prompt: repeat or number words, spell out numbers."""
    rows: list[tuple[str, str]] = []
    for _ in range(n):
        picked = rng.sample(words, rng.randint(20, 60))
        rows.append((f"Repeat these words: {' '.join(picked)}", " ".join(picked)))
        listed = rng.sample(words, rng.randint(10, 30))
        rows.append((f"Number these words, one per line: {', '.join(listed)}",
                     "\n".join(f"{i}. {w}" for i, w in enumerate(listed, 1))))
        lo = rng.randint(1, 8)
        hi = rng.randint(lo + 8, len(NUMBER_WORDS) - 1)
        rows.append((f"Spell out the numbers from {NUMBER_WORDS[lo]} to {NUMBER_WORDS[hi]}.",
                     " ".join(NUMBER_WORDS[lo : hi + 1]).capitalize() + "."))
    return rows


def _task_rows(rng: random.Random) -> list[tuple[str, str]]:
    """All candidate (user, answer) pairs, in a deterministic order: ~2/3 grounded in the
    prompt's text, the rest open-ended or structured."""
    docstrings = _docstrings()
    words = sorted({w.lower() for _, p in docstrings[:600] for w in re.findall(r"[a-zA-Z]{4,9}", p)})
    grounded, open_ended = _grounded_rows(docstrings), _open_rows(docstrings)
    rows = grounded + open_ended + _structured_rows(words, rng, len(grounded) // 20)
    return [(user, answer) for user, answer in rows if len(user) <= PROMPT_MAX_CHARS]


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
