"""Stage-2 ranking: from the retriever's N candidates, choose and order the K the agent will see.

Three rankers, chosen by name (`RANKERS`):
- `llm`: a generative listwise ranker. It reads the sub-query, the user's question and the numbered
  candidates, writes `<reason>...</reason>` then `<ranking>[i] > [j] > ...</ranking>` with exactly K distinct
  ids. Strict parsing (training) rejects anything else, a missing or unclosed reason included (METHOD.md counts
  missing tags as invalid), and falls back to the retriever's top-K, flagged invalid so the reward stage can
  penalise it. Lenient parsing (evaluation) keeps the valid ids in order
  and fills the rest in retriever order; `valid` still reports the strict verdict.
- `none`: the retriever's top-K (Search-R1's setting).
- `oracle`: candidates containing a gold answer first (in retriever order), then the rest in retriever order.

Permutations are 0-based candidate indices; the prompt numbers candidates from 1.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from cosearch_cli.agent import chat_prompt_ids, truncate_to_tokens
from cosearch_cli.formats import RANKING_CLOSE, RANKING_OPEN, REASON_CLOSE, REASON_OPEN
from cosearch_cli.records import Passage

RANKERS = ("llm", "none", "oracle")
# Which ranker calls a supervised warm-up demonstrates (`cosearch warmup --ranker-demos`, train's
# `warmup_ranker_demos`); cosearch_cli/warmup.py says what each kind keeps.
RANKER_DEMOS = ("all", "evidence", "shuffled", "balanced")

RANKER_INSTRUCTION = (
    "You rank search results for a search agent. The agent is answering the question below and issued the "
    "search query below. Choose the {k} passages that best help answer the query and the question, best "
    "first. Write a short reason between {reason_open} and {reason_close}, then the ranking between "
    "{ranking_open} and {ranking_close} as exactly {k} distinct passage numbers, for example "
    "{ranking_open} {example} {ranking_close}.\n\n"
    "Question: {question}\nSearch query: {query}\n\nPassages:\n{passages}"
)


def prompt_ids(tokenizer, question: str, query: str, passages: Sequence[Passage], k: int,
               passage_tokens: int, instruction: str = RANKER_INSTRUCTION) -> list[int]:
    """The ranker's chat prompt. With fewer candidates than K it asks for all of them, as the parser does."""
    k = min(k, len(passages))
    texts = truncate_to_tokens(tokenizer, [p.text for p in passages], passage_tokens)
    numbered = "\n".join(f"[{i}] {p.title}: {t}" for i, (p, t) in enumerate(zip(passages, texts), start=1))
    example = " > ".join(f"[{i}]" for i in _example_ids(len(passages), k))
    user = instruction.format(k=k, question=question, query=query, passages=numbered, example=example,
                              reason_open=REASON_OPEN, reason_close=REASON_CLOSE, ranking_open=RANKING_OPEN,
                              ranking_close=RANKING_CLOSE)
    return chat_prompt_ids(tokenizer, user)


def _example_ids(n: int, k: int) -> list[int]:
    # A shuffled-looking example, so the model is not nudged towards copying the retriever order.
    ids = list(range(n, 0, -2)) + list(range(n - 1, 0, -2))
    return ids[:k]


@dataclass
class Ranking:
    permutation: list[int]  # 0-based candidate indices, best first
    valid: bool
    error: str | None = None


_ID = re.compile(r"\[\s*(\d+)\s*\]")
_STRICT_LIST = re.compile(r"\s*\[\s*\d+\s*\](?:\s*>\s*\[\s*\d+\s*\])*\s*")


def parse_ranking(text: str, n: int, k: int, *, lenient: bool = False) -> Ranking:
    """Check the ranker's output strictly; on failure fall back to the retriever's top-K (or repair it)."""
    k = min(k, n)
    ids, error = _strict_ids(text, n, k)
    if error is None:
        return Ranking([i - 1 for i in ids], valid=True)
    permutation = _lenient(text, n, k) if lenient else list(range(k))
    return Ranking(permutation, valid=False, error=error)


def _strict_ids(text: str, n: int, k: int) -> tuple[list[int], str | None]:
    start, end = text.find(RANKING_OPEN), text.find(RANKING_CLOSE)
    if start < 0 or end < start:
        return [], f"missing {RANKING_OPEN}...{RANKING_CLOSE}"
    reason_start, reason_end = text.find(REASON_OPEN), text.find(REASON_CLOSE)
    if not 0 <= reason_start < reason_end < start:
        return [], f"missing {REASON_OPEN}...{REASON_CLOSE} before {RANKING_OPEN}"
    body = text[start + len(RANKING_OPEN):end]
    if not _STRICT_LIST.fullmatch(body):
        return [], "ranking is not of the form [i] > [j] > ..."
    ids = [int(m) for m in _ID.findall(body)]
    if len(ids) != k:
        return [], f"expected {k} ids, got {len(ids)}"
    if len(set(ids)) != len(ids):
        return [], "duplicate ids"
    outside = [i for i in ids if not 1 <= i <= n]
    if outside:
        return [], f"id {outside[0]} out of range 1..{n}"
    return ids, None


def _lenient(text: str, n: int, k: int) -> list[int]:
    start = text.find(RANKING_OPEN)
    body = text[start + len(RANKING_OPEN):] if start >= 0 else text
    chosen: list[int] = []
    for match in _ID.findall(body):
        index = int(match) - 1
        if 0 <= index < n and index not in chosen:
            chosen.append(index)
    chosen = chosen[:k]
    return chosen + [i for i in range(n) if i not in chosen][:k - len(chosen)]


def top_k(n: int, k: int) -> list[int]:
    """The `none` ranker: the retriever's own order."""
    return list(range(min(n, k)))


def oracle(has_answer: Sequence[bool], k: int) -> list[int]:
    """The `oracle` ranker: answer-bearing candidates first, each part in retriever order."""
    order = [i for i, h in enumerate(has_answer) if h] + [i for i, h in enumerate(has_answer) if not h]
    return order[:k]
