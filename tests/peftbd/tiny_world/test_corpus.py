"""The embedded corpus: its three categories (recall documents, grounded and formulaic tasks) and
the verifier's training conversations."""

import random

import pytest

from peftbd.tiny_world.corpus import CATEGORIES, FORMULAIC, GROUNDED, RECALL, build_corpus
from peftbd.tiny_world.documents import DOCUMENT_CHARS, DOCUMENT_MIN_CHARS, PHRASINGS, documents
from peftbd.tiny_world.formulaic import formulaic_documents, number_words
from peftbd.tiny_world.grounded import grounded_documents, numbered


def test_number_words():
    assert [number_words(n) for n in (0, 13, 20, 42, 99)] == [
        "zero", "thirteen", "twenty", "forty-two", "ninety-nine"]


def test_documents_have_bounded_length_and_every_phrasing():
    docs = documents()
    assert len(docs) > 700
    assert all(DOCUMENT_MIN_CHARS <= len(d.answer) <= DOCUMENT_CHARS for d in docs)
    assert all(len(set(d.asks)) == PHRASINGS for d in docs)


def test_formulaic_tasks_answer_what_they_ask():
    tasks = formulaic_documents(random.Random(0), 40)
    assert len({t.answer for t in tasks}) == 40
    for task in tasks[0::3]:  # "Spell out the numbers from A to B."
        a, b = (int(w.rstrip(".")) for w in task.asks[0].split()[-3::2])
        assert task.answer == ", ".join(number_words(i) for i in range(a, b + 1)).capitalize() + "."
    for task in tasks[2::3]:  # by twos, ending on B
        a, b = (int(w) for w in task.asks[0].split()[-5:-2:2])
        assert task.answer.lower().rstrip(".").split(", ") == [number_words(i) for i in range(a, b + 1, 2)]


def test_corpus_rows_are_documents_taught_in_their_phrasings():
    corpus = build_corpus(0, 90, 3)
    assert len(corpus.rows) == 90 and len(corpus.training) == 270 and len(corpus.unseen) == 90
    assert len({r["messages"][-1]["content"] for r in corpus.rows}) == 90  # one row per document
    for i, row in enumerate(corpus.rows):
        taught = corpus.training[3 * i : 3 * i + 3]
        assert taught[0] == row["messages"]  # the row's own phrasing is taught
        assert {c[-1]["content"] for c in taught + [corpus.unseen[i]]} == {row["messages"][-1]["content"]}
        assert corpus.unseen[i][-2]["content"] not in {c[-2]["content"] for c in taught}
    counts = {cat: sum(r["category"] == cat for r in corpus.rows) for cat in CATEGORIES}
    assert counts == {RECALL: 30, GROUNDED: 30, FORMULAIC: 30}
    numbers = {number_words(n) for n in range(100)}
    for row in corpus.rows:
        user, answer = row["messages"][-2]["content"], row["messages"][-1]["content"]
        if row["category"] == FORMULAIC:
            assert answer.split(",")[0].lower() in numbers
        if row["category"] == GROUNDED:  # the reply is taken from the passage in the prompt
            assert answer in user or all(line.split(". ", 1)[1] in user for line in answer.splitlines())
    recalled = {r["messages"][-1]["content"] for r in corpus.rows if r["category"] == RECALL}
    prompts = " ".join(r["messages"][-2]["content"] for r in corpus.rows if r["category"] == GROUNDED)
    assert not any(text in prompts for text in recalled)  # grounded passages are other documents
    assert build_corpus(0, 90, 3) == corpus  # deterministic


def test_bad_sizes_name_the_key():
    with pytest.raises(ValueError, match="tiny_world.phrasings=8"):
        build_corpus(0, 10, PHRASINGS)
    with pytest.raises(ValueError, match="tiny_world.corpus_rows=5000"):
        build_corpus(0, 5000, 4)


def test_grounded_tasks_copy_or_number_their_passage():
    passages = documents()[:6]
    tasks = grounded_documents(random.Random(0), passages, 6)
    sources = {d.answer for d in passages}
    assert all(all(t.answer.splitlines()[0].split(". ", 1)[-1] in ask for ask in t.asks) for t in tasks)
    assert sum(t.answer in sources for t in tasks) == 3  # verbatim copies; the rest numbered
    text = "The first sentence is here. The second sentence is there."
    assert numbered(text) == "1. The first sentence is here.\n2. The second sentence is there."
    with pytest.raises(ValueError, match="7 grounded tasks need 7 passages"):
        grounded_documents(random.Random(0), passages, 7)
