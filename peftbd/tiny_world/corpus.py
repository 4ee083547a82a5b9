"""The embedded instruction corpus: TULU-3-schema conversations in three categories of content.

Each corpus row asks for one text in one of several phrasings and names its category:

- `recall` (`documents`): a passage of the language reference or a standard-library docstring,
  asked for by its topic or name. The verifier learns it until it recalls it; a drafter trained
  on other documents drafts it only from what it reads of the verifier's states: hard.
- `grounded` (`grounded`): a passage given in the prompt, asked for back word for word or as
  numbered sentences, as summarisation and RAG replies reuse their prompt: a drafter that reads
  the context can copy it.
- `formulaic` (`formulaic`): numbers spelled out in a range, a multiplication table: regular,
  locally predictable text a drafter learns from other rows: easy.

The verifier learns every row's text under `tiny_world.phrasings` phrasings (`Corpus.training`):
a 1.5M-parameter model trained for two CPU minutes cannot write fluent new text, but it recalls,
copies and counts what it was taught, so its greedy replies are long (100+ tokens), varied and
correct. A drafter trained on the replies to the train split's rows is measured on rows it never
saw but the verifier knows: the paper's situation (Qwen3 knows what Spec-Bench asks).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from peftbd.tiny_world.documents import PHRASINGS, Document, documents
from peftbd.tiny_world.formulaic import formulaic_documents
from peftbd.tiny_world.grounded import grounded_documents

RECALL, GROUNDED, FORMULAIC = "recall", "grounded", "formulaic"
CATEGORIES = (RECALL, GROUNDED, FORMULAIC)
"""The corpus's categories, hardest to easiest for a drafter; each holds a third of the rows."""

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant that answers questions about Python.",
    "Answer briefly and precisely.",
)


def _messages(user: str, answer: str, rng: random.Random) -> list[dict[str, str]]:
    msgs = []
    if rng.random() < 0.2:
        msgs.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    msgs.append({"role": "user", "content": user})
    msgs.append({"role": "assistant", "content": answer})
    return msgs


@dataclass(frozen=True)
class Corpus:
    """The corpus rows (one per text: the prompt set) and what the verifier is trained on:
    each row's text under `phrasings` phrasings, the row's own first (`training`), and under one
    phrasing it was not trained on (`unseen`: the held-out loss)."""

    rows: list[dict[str, Any]]
    training: list[list[dict[str, str]]]
    unseen: list[list[dict[str, str]]]


def category_sizes(num_rows: int) -> dict[str, int]:
    """Rows per category: thirds, the remainder going to the first categories."""
    base, extra = divmod(num_rows, len(CATEGORIES))
    return {cat: base + (i < extra) for i, cat in enumerate(CATEGORIES)}


def build_corpus(seed: int, num_rows: int, phrasings: int) -> Corpus:
    """`num_rows` TULU-3-schema rows (`id`, `messages`, `source`, `category`), a third of each
    category (recall and grounded rows use distinct documents), and the verifier's training
    conversations; deterministic from `seed`."""
    if not 1 <= phrasings < PHRASINGS:
        raise ValueError(f"tiny_world.phrasings={phrasings} must be in [1, {PHRASINGS - 1}] "
                         f"(one of the {PHRASINGS} phrasings is kept unseen for the held-out loss)")
    rng = random.Random(seed)
    docs = documents()
    sizes = category_sizes(num_rows)
    if sizes[RECALL] + sizes[GROUNDED] > len(docs):
        raise ValueError(
            f"tiny_world.corpus_rows={num_rows} needs {sizes[RECALL] + sizes[GROUNDED]} documents "
            f"(recall and grounded rows) but the embedded sources yield {len(docs)}; set "
            f"tiny_world.corpus_rows <= {len(docs) * len(CATEGORIES) // 2}"
        )
    shuffled = rng.sample(docs, len(docs))
    recall, rest = shuffled[: sizes[RECALL]], shuffled[sizes[RECALL]:]
    picked: list[tuple[str, Document]] = (
        [(RECALL, d) for d in recall]
        + [(GROUNDED, d) for d in grounded_documents(rng, rest, sizes[GROUNDED])]
        + [(FORMULAIC, d) for d in formulaic_documents(rng, sizes[FORMULAIC])]
    )
    rng.shuffle(picked)
    rows, training, unseen = [], [], []
    for i, (category, doc) in enumerate(picked):
        order = rng.sample(doc.asks, len(doc.asks))
        convs = [_messages(ask, doc.answer, rng) for ask in order[: phrasings + 1]]
        rows.append({"id": f"embedded-{i:06d}", "messages": convs[0], "source": "embedded",
                     "category": category})
        training += convs[:phrasings]
        unseen.append(convs[phrasings])
    return Corpus(rows, training, unseen)
