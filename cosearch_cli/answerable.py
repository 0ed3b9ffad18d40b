"""Training questions the agent can answer from what it is shown (TrainConfig `rl_questions = "answerable"`).

A question is kept when a gold answer lies within the first `passage_tokens` tokens (as the agent reads them) of
one of the retriever's top `k` passages for the question's own text (a warmed-up agent's first query is most
often the question verbatim), by DPR-style has_answer (yes/no answers never count), and no gold answer is the
title of one of the retriever's top `top_n` (a copied title would earn the reward without reading). It selects
training data with the gold answers, as pass-rate filtering does; the reward, grouping and updates stay
METHOD.md's. On the others a sampled group most often scores 0 throughout and carries no signal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cosearch_cli.agent import truncate_to_tokens
from cosearch_cli.metrics import has_answer, normalize_answer
from cosearch_cli.records import Question

QUALIFIER = re.compile(r"\s*\([^)]*\)\s*$")


def title_forms(title: str) -> set[str]:
    """A title's normalised forms: as written, and without a trailing "(...)" qualifier."""
    return {normalize_answer(title), normalize_answer(QUALIFIER.sub("", title))} - {""}


def answer_is_title(answers: Sequence[str], titles: Sequence[str]) -> bool:
    """Whether a normalised gold answer (SQuAD normalisation, as EM uses) is one of the titles' forms."""
    forms = set().union(*map(title_forms, titles))
    return any(normalize_answer(a) in forms for a in answers)


def answer_in_view(tokenizer, answers: Sequence[str], texts: Sequence[str], budget: int | None) -> list[bool]:
    """Per text: whether a gold answer lies within its first `budget` tokens (None: anywhere in it)."""
    shown = texts if budget is None else truncate_to_tokens(tokenizer, texts, budget)
    return [has_answer(t, answers) for t in shown]


def answerable(answers: Sequence[str], texts: Sequence[str], titles: Sequence[str], *, k: int, tokenizer,
               passage_tokens: int) -> bool:
    """A gold answer shows within the first `passage_tokens` of one of the first `k` texts, and no gold answer
    is one of the `titles`."""
    return any(answer_in_view(tokenizer, answers, texts[:k], passage_tokens)) and not answer_is_title(answers, titles)


def answerable_questions(questions: Sequence[Question], *, index, retriever: str | None, tokenizer, k: int, top_n: int,
                         passage_tokens: int) -> list[Question]:
    """The `questions` that are `answerable` from the retriever's top `top_n` for their own text, in order."""
    if not questions:
        return []
    hits = index.retriever(retriever).search([q.question for q in questions], max(k, top_n))
    kept = []
    for question, found in zip(questions, hits):
        passages = index.docs.get([h.id for h in found])
        answers = [str(a) for a in question.answers]
        if answerable(answers, [p.text for p in passages], [p.title for p in passages[:top_n]], k=k,
                      tokenizer=tokenizer, passage_tokens=passage_tokens):
            kept.append(question)
    return kept
