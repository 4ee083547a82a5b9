"""The recall documents of the embedded corpus: prose shipped with Python.

Sources are `pydoc_data.topics` (the language reference, ~465 kB of English, cut into passages)
and the docstrings of a fixed list of standard-library modules. Each *document* (a passage or a
docstring, 300-600 characters: ~85-170 tiny tokens, so a reply runs for many D = 16 blocks) is
asked for in one of several phrasings. The verifier learns each until it recalls it; a drafter
never saw the held-out ones, so only what it reads from the verifier's states drafts them.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
from dataclasses import dataclass

import pydoc_data.topics

@dataclass(frozen=True)
class Document:
    """A text the verifier learns, and the user turns (one per phrasing) that ask for it."""

    answer: str
    asks: tuple[str, ...]


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

DOCUMENT_MIN_CHARS = 300
"""Shortest document kept (~85 tokens): replies in the paper's regime run for many blocks."""
DOCUMENT_CHARS = 600
"""Documents are cut at sentence ends to at most this many characters (~170 tokens); one whose
single sentence is longer is left out, as is one asked for by a sentence longer than this."""

TOPIC_PHRASINGS = (
    "Explain the Python topic '{topic}'.", "What does the Python reference say about '{topic}'?",
    "Tell me about '{topic}' in Python.", "Describe the topic '{topic}'.",
    "Give an overview of '{topic}'.", "Summarize what the language reference says on '{topic}'.",
    "What should I know about '{topic}'?", "Explain '{topic}' to me.",
)
"""How the first passage of a topic is asked for."""
PASSAGE_PHRASINGS = (
    "Continue the text: {prev}", "Go on from here: {prev}",
    "What follows this sentence of the reference on '{topic}'? {prev}",
    "Continue the explanation of '{topic}' after: {prev}", "Keep going: {prev}",
    "Pick up from this passage and continue: {prev}",
    "Continue this passage about '{topic}': {prev}",
    "Here is a sentence from the Python reference: {prev} Continue it.",
)
"""How a later passage of a topic is asked for: by the sentence before it."""
DOCSTRING_PHRASINGS = (
    "What does `{name}` do?", "Describe `{name}`.", "Explain `{name}` from the standard library.",
    "Tell me about {name}.", "What is `{name}` for?", "How does `{name}` behave?",
    "Document `{name}`.", "Give me the documentation of `{name}`.",
)
"""How a docstring is asked for."""
PHRASINGS = len(TOPIC_PHRASINGS)
assert PHRASINGS == len(PASSAGE_PHRASINGS) == len(DOCSTRING_PHRASINGS)

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"(])")


def _clean(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(_clean(text)) if len(s) > 20]


def _fitting(parts: list[str], max_chars: int) -> int:
    """How many leading sentences of `parts` fit, joined, in `max_chars` (at least one)."""
    n = 1
    while n < len(parts) and len(" ".join(parts[: n + 1])) <= max_chars:
        n += 1
    return n


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


def _topic_sentences() -> list[tuple[str, list[str]]]:
    """(topic, its sentences) of the language reference, in topic order."""
    by_topic: dict[str, list[str]] = {}
    for topic, para in _topic_paragraphs():
        by_topic.setdefault(topic, []).extend(sentences(para))
    return sorted(by_topic.items())


def _passages(parts: list[str]) -> list[tuple[str, str]]:
    """(sentence before, passage) of consecutive passages of whole sentences cut from
    `parts`, each at most DOCUMENT_CHARS long unless one sentence is longer."""
    out, i = [], 0
    while i < len(parts):
        j = i + _fitting(parts[i:], DOCUMENT_CHARS)
        out.append((parts[i - 1] if i else "", " ".join(parts[i:j])))
        i = j
    return out


def documents() -> list[Document]:
    """Every document of the embedded sources, in a fixed order: the language reference's
    passages (the first of a topic asked for by its name, later ones by the sentence before
    them), then docstrings (asked for by qualified name)."""
    docs = []
    for topic, topic_sentences in _topic_sentences():
        for prev, passage in _passages(topic_sentences):
            if not DOCUMENT_MIN_CHARS <= len(passage) <= DOCUMENT_CHARS or len(prev) > DOCUMENT_CHARS:
                continue
            phrasings = PASSAGE_PHRASINGS if prev else TOPIC_PHRASINGS
            docs.append(Document(passage, tuple(p.format(topic=topic, prev=prev) for p in phrasings)))
    for name, doc in _docstrings():
        parts = sentences(doc) or [doc]
        answer = " ".join(parts[: _fitting(parts, DOCUMENT_CHARS)])
        if DOCUMENT_MIN_CHARS <= len(answer) <= DOCUMENT_CHARS:
            docs.append(Document(answer, tuple(p.format(name=name) for p in DOCSTRING_PHRASINGS)))
    return docs
