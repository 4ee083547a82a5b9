"""The embedded instruction corpus: TULU-3-schema conversations built from prose shipped with Python.

Sources are `pydoc_data.topics` (the language reference, ~465 kB of English, cut into passages)
and the docstrings of a fixed list of standard-library modules. Each *document* (a passage or a
docstring, 300-600 characters: ~85-170 tiny tokens, so a reply runs for many D = 16 blocks) is
one corpus row, asked for in one of several phrasings. The verifier learns every document under
`tiny_world.phrasings` phrasings (`Corpus.training`) until it recalls it: a 1.5M-parameter
model trained for two CPU minutes cannot write fluent new text (its greedy replies to open
questions loop), but it can recall what it was taught, so its greedy replies are long, varied
text. A drafter trained on the replies to the train split's documents is measured on documents
it never saw but the verifier knows: the paper's situation (Qwen3 knows what Spec-Bench asks).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import random
import re
from dataclasses import dataclass
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


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(_clean(text)) if len(s) > 20]


def _fitting(sentences: list[str], max_chars: int) -> int:
    """How many leading `sentences` fit, joined, in `max_chars` (at least one)."""
    n = 1
    while n < len(sentences) and len(" ".join(sentences[: n + 1])) <= max_chars:
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


@dataclass(frozen=True)
class Document:
    """A text the verifier learns, and the user turns (one per phrasing) that ask for it."""

    answer: str
    asks: tuple[str, ...]


def _topic_sentences() -> list[tuple[str, list[str]]]:
    """(topic, its sentences) of the language reference, in topic order."""
    by_topic: dict[str, list[str]] = {}
    for topic, para in _topic_paragraphs():
        by_topic.setdefault(topic, []).extend(_sentences(para))
    return sorted(by_topic.items())


def _passages(sentences: list[str]) -> list[tuple[str, str]]:
    """(sentence before, passage) of consecutive passages of whole sentences cut from
    `sentences`, each at most DOCUMENT_CHARS long unless one sentence is longer."""
    out, i = [], 0
    while i < len(sentences):
        j = i + _fitting(sentences[i:], DOCUMENT_CHARS)
        out.append((sentences[i - 1] if i else "", " ".join(sentences[i:j])))
        i = j
    return out


def documents() -> list[Document]:
    """Every document of the embedded sources, in a fixed order: the language reference's
    passages (the first of a topic asked for by its name, later ones by the sentence before
    them), then docstrings (asked for by qualified name)."""
    docs = []
    for topic, sentences in _topic_sentences():
        for prev, passage in _passages(sentences):
            if not DOCUMENT_MIN_CHARS <= len(passage) <= DOCUMENT_CHARS or len(prev) > DOCUMENT_CHARS:
                continue
            phrasings = PASSAGE_PHRASINGS if prev else TOPIC_PHRASINGS
            docs.append(Document(passage, tuple(p.format(topic=topic, prev=prev) for p in phrasings)))
    for name, doc in _docstrings():
        sentences = _sentences(doc) or [doc]
        answer = " ".join(sentences[: _fitting(sentences, DOCUMENT_CHARS)])
        if DOCUMENT_MIN_CHARS <= len(answer) <= DOCUMENT_CHARS:
            docs.append(Document(answer, tuple(p.format(name=name) for p in DOCSTRING_PHRASINGS)))
    return docs


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
         "fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    """English words for 0 <= n <= 99 ("forty-two")."""
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens - 2] + (f"-{_ONES[ones]}" if ones else "")


SPELL_PHRASINGS = (
    "Spell out the numbers from {a} to {b}.", "Write the numbers {a} to {b} in words.",
    "Count from {a} to {b} in words.", "List the numbers from {a} to {b}, spelled out.",
    "In words, count from {a} up to {b}.", "Spell every number from {a} to {b}.",
    "Write out, in English words, the numbers {a} through {b}.",
    "Name the numbers from {a} to {b} in words.",
)
DOWN_PHRASINGS = (
    "Count down from {b} to {a} in words.", "Spell out the numbers from {b} down to {a}.",
    "Write the numbers {b} to {a}, counting down, in words.",
    "In words, count backwards from {b} to {a}.", "List the numbers from {b} down to {a}, spelled out.",
    "Spell every number from {b} down to {a}.", "Count backwards in English words from {b} to {a}.",
    "Name the numbers from {b} down to {a} in words.",
)
TWOS_PHRASINGS = (
    "Count by twos from {a} to {b} in words.", "Spell out every second number from {a} to {b}.",
    "In words, count from {a} to {b} in steps of two.", "List every other number from {a} to {b}, spelled out.",
    "Write the numbers from {a} to {b} in steps of 2, in words.",
    "Skip-count by two from {a} to {b}, in words.", "Spell out {a}, {a} + 2, and so on up to {b}.",
    "Name every second number from {a} to {b} in words.",
)
TABLE_PHRASINGS = (
    "Write the multiplication table of {a} up to {a} x {b}.",
    "Give the times table for {a}, from 1 to {b}.", "Multiply {a} by 1 to {b}, one line each.",
    "List {a} x 1 through {a} x {b}.", "What is the {a} times table up to {b}?",
    "Show the multiplication table of {a} to {b}.", "Recite the {a} times table up to {b}.",
    "Write out {a} times each number from 1 to {b}.",
)
STRUCTURED_SHARE = 1 / 3
"""Share of the corpus rows that are structured tasks (spell out a range of numbers, a
multiplication table): replies a verifier computes rather than recalls, with the regular,
locally predictable structure (lists, formulas, enumerations) that lets a drafter learn to
draft in a small world, as formulaic text does in a large one; the rest are documents."""


def structured_documents(rng: random.Random, n: int) -> list[Document]:
    """`n` distinct structured tasks, cycling: spell out a range of numbers up, down, by twos,
    and a multiplication table (words, not digit runs: counting in digits repeats its 4-grams
    `, 2`, `0` ... and would read as a loop in the repetition measure)."""
    docs: dict[str, Document] = {}
    while len(docs) < n:
        kind = len(docs) % 4
        a = rng.randint(0, 60)
        b = rng.randint(a + 12, min(a + 40, 99))
        if kind == 3:  # a table draws its own a, b (the range's draws above are unused)
            a, b = rng.randint(2, 40), rng.randint(10, 15)
            answer = "\n".join(f"{a} x {i} = {a * i}" for i in range(1, b + 1))
            phrasings = TABLE_PHRASINGS
        else:
            if kind == 2:
                b = a + 2 * ((min(99, a + 2 * (b - a)) - a) // 2)  # lands on b
            numbers = (range(a, b + 1), range(b, a - 1, -1), range(a, b + 1, 2))[kind]
            answer = ", ".join(number_words(i) for i in numbers).capitalize() + "."
            phrasings = (SPELL_PHRASINGS, DOWN_PHRASINGS, TWOS_PHRASINGS)[kind]
        docs.setdefault(answer, Document(answer, tuple(p.format(a=a, b=b) for p in phrasings)))
    return list(docs.values())


def _messages(user: str, answer: str, rng: random.Random) -> list[dict[str, str]]:
    msgs = []
    if rng.random() < 0.2:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    msgs.append({"role": "user", "content": user})
    msgs.append({"role": "assistant", "content": answer})
    return msgs


@dataclass(frozen=True)
class Corpus:
    """The corpus rows (one per document: the prompt set) and what the verifier is trained on:
    each row's document under `phrasings` phrasings, the row's own first (`training`), and under
    one phrasing it was not trained on (`unseen`: the held-out loss)."""

    rows: list[dict[str, Any]]
    training: list[list[dict[str, str]]]
    unseen: list[list[dict[str, str]]]


def build_corpus(seed: int, num_rows: int, phrasings: int) -> Corpus:
    """`num_rows` TULU-3-schema rows (`id`, `messages`, `source`), one per document or structured
    task (STRUCTURED_SHARE of them), and the verifier's training conversations; deterministic
    from `seed`."""
    if not 1 <= phrasings < PHRASINGS:
        raise ValueError(f"tiny_world.phrasings={phrasings} must be in [1, {PHRASINGS - 1}] "
                         f"(one of the {PHRASINGS} phrasings is kept unseen for the held-out loss)")
    rng = random.Random(seed)
    docs = documents()
    structured = round(num_rows * STRUCTURED_SHARE)
    if num_rows - structured > len(docs):
        raise ValueError(
            f"tiny_world.corpus_rows={num_rows} needs {num_rows - structured} documents but the "
            f"embedded sources yield {len(docs)}; set tiny_world.corpus_rows <= "
            f"{int(len(docs) / (1 - STRUCTURED_SHARE))}"
        )
    picked = rng.sample(docs, num_rows - structured) + structured_documents(rng, structured)
    rng.shuffle(picked)
    rows, training, unseen = [], [], []
    for i, doc in enumerate(picked):
        order = rng.sample(doc.asks, len(doc.asks))
        convs = [_messages(ask, doc.answer, rng) for ask in order[: phrasings + 1]]
        rows.append({"id": f"embedded-{i:06d}", "messages": convs[0], "source": "embedded"})
        training += convs[:phrasings]
        unseen.append(convs[phrasings])
    return Corpus(rows, training, unseen)
