"""Text metrics shared by every stage: SQuAD normalisation, EM, SubEM, token F1, DPR has_answer.

One module so that rewards, evaluation and the oracle ranker can never disagree on what "correct" means.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence

import regex

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)
_YES_NO = {"yes", "no", "noanswer"}
_NEVER_CONTAINED = {"yes", "no", "true", "false"}


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, drop articles, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def substring_match(prediction: str, golds: Sequence[str]) -> float:
    """SubEM: some normalised gold answer occurs inside the normalised prediction."""
    pred = normalize_answer(prediction)
    return float(any((g_norm := normalize_answer(g)) and g_norm in pred for g in golds))


def _f1_one(prediction: str, gold: str, yes_no_rule: bool) -> float:
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    if yes_no_rule and (pred_norm in _YES_NO or gold_norm in _YES_NO) and pred_norm != gold_norm:
        return 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: Sequence[str], *, yes_no_rule: bool = False) -> float:
    """Token F1 against the best-matching gold alias.

    `yes_no_rule` is HotpotQA's official rule: when either side normalises to yes/no/noanswer and the two
    differ, F1 is 0. Off by default, as Search-R1 and CoSearch score.
    """
    return max((_f1_one(prediction, g, yes_no_rule) for g in golds), default=0.0)


def answer_scores(prediction: str | None, golds: Sequence[str], *, yes_no_rule: bool = False) -> dict:
    """EM, SubEM and F1 of one prediction; a missing prediction scores 0 on all three."""
    if prediction is None:
        return {"em": 0.0, "subem": 0.0, "f1": 0.0}
    return {
        "em": exact_match(prediction, golds),
        "subem": substring_match(prediction, golds),
        "f1": token_f1(prediction, golds, yes_no_rule=yes_no_rule),
    }


# --- DPR-style answer containment -------------------------------------------------------------------

# DPR's SimpleTokenizer: runs of letters/digits/combining marks, or any single non-space character.
_TOKEN = regex.compile(r"[\p{L}\p{N}\p{M}]+|[^\p{Z}\p{C}]", regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)


def _dpr_tokens(text: str) -> list[str]:
    text = unicodedata.normalize("NFD", text)
    return [t.lower() for t in _TOKEN.findall(text)]


def has_answer(passage: str, answers: Sequence[str]) -> bool:
    """True if some answer's tokens occur as a contiguous token run in the passage (uncased, NFD).

    Answers that are only yes/no/true/false never count: they would match almost any passage.
    """
    passage_tokens = _dpr_tokens(passage)
    for answer in answers:
        if normalize_answer(answer) in _NEVER_CONTAINED:
            continue
        answer_tokens = _dpr_tokens(answer)
        if not answer_tokens:
            continue
        width = len(answer_tokens)
        first = answer_tokens[0]
        for start in range(len(passage_tokens) - width + 1):
            if passage_tokens[start] == first and passage_tokens[start:start + width] == answer_tokens:
                return True
    return False


# What a rollout's candidate_has_answer flags were computed on; recorded in its `sampling`.
ANSWER_CONTAINMENT = "text"


def passage_has_answer(passage, answers: Sequence[str]) -> bool:
    """Whether a retrieved passage contains a gold answer: DPR's has_answer on its text, never its title (a
    passage titled "Protestantism" whose text says only "Protestant" does not contain "Protestantism").
    The ranker's reward (r_rel), its easy/hard split, the oracle ranker and Hit@k all use this."""
    return has_answer(passage.text, answers)
