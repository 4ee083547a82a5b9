"""Prompt-grounded tasks of the embedded corpus: the reply is taken from a passage in the prompt.

Real chat output is partly grounded in its prompt (Spec-Bench's summarisation, RAG and
translation categories copy or rearrange what the prompt holds), which is what lets a drafter
that reads the context draft it. The tiny world's grounded tasks give a passage of the language
reference or a docstring in the prompt and ask for it back: word for word, or one sentence per
numbered line. A transformer learns to copy from its context (induction heads) within the world's
training budget; a drafter trained on other passages can copy too, so this category measures
how well a drafter reads the context rather than what the verifier memorised.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from peftbd.tiny_world.documents import Document, sentences

COPY_PHRASINGS = (
    "Repeat this text word for word: {p}", "Copy the following passage exactly.\n\n{p}",
    "Here is a passage: {p}\n\nRepeat it.", "Quote this back to me: {p}",
    "Echo the text below.\n{p}", "Please reproduce the following verbatim: {p}",
    "Read this and write it out again: {p}", "Text: {p}\nRepeat the text above exactly.",
)
"""How a verbatim copy of the passage `p` is asked for."""
NUMBERED_PHRASINGS = (
    "List the sentences of this text, numbered: {p}",
    "Split the following passage into numbered sentences.\n\n{p}",
    "Number each sentence of this text, one per line: {p}",
    "Here is a passage: {p}\n\nWrite its sentences as a numbered list.",
    "Give every sentence of the text below on its own numbered line.\n{p}",
    "Break this text into a numbered list of its sentences: {p}",
    "Text: {p}\nList the sentences above, numbered.",
    "Rewrite this passage as numbered sentences: {p}",
)
"""How the passage `p` is asked for one sentence per numbered line."""


def numbered(passage: str) -> str:
    """`passage`'s sentences, one per line, numbered from 1 ("1. ...")."""
    return "\n".join(f"{i}. {s}" for i, s in enumerate(sentences(passage) or [passage], 1))


def grounded_documents(rng: random.Random, passages: Sequence[Document], n: int) -> list[Document]:
    """`n` grounded tasks over `n` distinct `passages` (documents' answers), alternating a verbatim
    copy and a numbered list of the passage's sentences; deterministic from `rng`'s state."""
    if n > len(passages):
        raise ValueError(f"{n} grounded tasks need {n} passages; {len(passages)} are left")
    picked = rng.sample(list(passages), n)
    out = []
    for i, doc in enumerate(picked):
        copy = i % 2 == 0
        phrasings = COPY_PHRASINGS if copy else NUMBERED_PHRASINGS
        answer = doc.answer if copy else numbered(doc.answer)
        out.append(Document(answer, tuple(p.format(p=doc.answer) for p in phrasings)))
    return out
