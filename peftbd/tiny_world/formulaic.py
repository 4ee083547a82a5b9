"""Formulaic tasks of the embedded corpus: replies the verifier computes rather than recalls.

Spell out a range of numbers (up, down, by twos): regular,
locally predictable text (lists, formulas, enumerations) that a drafter can learn to draft in a
small world, as formulaic and procedural text is in a large one.
"""

from __future__ import annotations

import random

from peftbd.tiny_world.documents import Document

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
def formulaic_documents(rng: random.Random, n: int) -> list[Document]:
    """`n` distinct formulaic tasks, cycling: spell out a range of numbers up, down and by twos
    (words, not digit runs: counting in digits repeats its 4-grams `, 2`, `0` ... and would read
    as a loop in the repetition measure; no arithmetic such as a multiplication table, which a
    verifier of this size never learns: its replies would be wrong)."""
    docs: dict[str, Document] = {}
    while len(docs) < n:
        kind = len(docs) % 3
        a = rng.randint(0, 60)
        b = rng.randint(a + 12, min(a + 40, 99))
        if kind == 2:
            b = a + 2 * ((min(99, a + 2 * (b - a)) - a) // 2)  # lands on b
        numbers = (range(a, b + 1), range(b, a - 1, -1), range(a, b + 1, 2))[kind]
        answer = ", ".join(number_words(i) for i in numbers).capitalize() + "."
        phrasings = (SPELL_PHRASINGS, DOWN_PHRASINGS, TWOS_PHRASINGS)[kind]
        docs.setdefault(answer, Document(answer, tuple(p.format(a=a, b=b) for p in phrasings)))
    return list(docs.values())
