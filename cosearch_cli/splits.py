"""Held-out question sets for studies: stratified over datasets, never a training or warm-up question.

A question is "the same" as another when it has the same id or the same normalised text (SQuAD normalisation:
case, punctuation, articles and spacing ignored), so a question copied into another file under another id
still counts as seen. Within a dataset questions are taken in sha1-of-id order, a fixed pseudo-random order
that does not depend on the file's order, so the same inputs always give the same set.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from cosearch_cli.errors import ConfigError
from cosearch_cli.metrics import normalize_answer
from cosearch_cli.records import Question


class QuestionKeys:
    """Ids and normalised texts of a set of questions, to tell whether another question is one of them."""

    def __init__(self, questions: Iterable[Question] = ()):
        self.ids: set[str] = set()
        self.texts: set[str] = set()
        for q in questions:
            self.add(q)

    def add(self, question: Question) -> None:
        self.ids.add(question.id)
        self.texts.add(normalize_answer(question.question))

    def matches(self, question: Question) -> bool:
        return question.id in self.ids or normalize_answer(question.question) in self.texts


def sha1_order(questions: Iterable[Question]) -> list[Question]:
    return sorted(questions, key=lambda q: hashlib.sha1(q.id.encode()).hexdigest())


def allocate(total: int, available: dict[str, int]) -> dict[str, int]:
    """Split `total` over datasets as evenly as their sizes allow: a dataset with fewer questions than its equal
    share gives all it has and the rest is shared among the others (smallest datasets are served first, ties
    by name; the remainder of an uneven division goes to the datasets served last)."""
    if total > sum(available.values()):
        raise ConfigError(f"{total} held-out questions asked for, only {sum(available.values())} available",
                          fix="ask for fewer, or exclude fewer questions")
    quotas, left = {}, total
    order = sorted(available, key=lambda d: (available[d], d))
    for i, dataset in enumerate(order):
        quotas[dataset] = min(available[dataset], left // (len(order) - i))
        left -= quotas[dataset]
    assert left == 0, "the quotas add up to the total"
    return {d: quotas[d] for d in available}


def draw_heldout(by_dataset: dict[str, Sequence[Question]], total: int,
                 excluded: QuestionKeys) -> tuple[list[Question], dict]:
    """`total` questions stratified over the datasets, none of them in `excluded`, each dataset's in sha1
    order; also how many each dataset had, lost to the exclusion and gave."""
    candidates = {d: [q for q in sha1_order(qs) if not excluded.matches(q)] for d, qs in by_dataset.items()}
    quotas = allocate(total, {d: len(qs) for d, qs in candidates.items()})
    chosen: list[Question] = []
    for dataset, quota in quotas.items():
        chosen += candidates[dataset][:quota]
    counts = {d: {"questions": len(by_dataset[d]), "excluded": len(by_dataset[d]) - len(candidates[d]),
                  "drawn": quotas[d]} for d in by_dataset}
    return chosen, counts
