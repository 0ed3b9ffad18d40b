"""Ranker output parsing (strict and lenient), the none and oracle rankers, and the ranker prompt."""

from __future__ import annotations

import pytest

from cosearch_cli.models import load_tokenizer
from cosearch_cli.ranker import Ranking, oracle, parse_ranking, prompt_ids, top_k
from cosearch_cli.records import Passage


def test_strict_parse_accepts_exactly_k_distinct_ids():
    text = "<reason>[4] names the city</reason> <ranking> [4] > [1]>[3] </ranking>"
    assert parse_ranking(text, n=5, k=3) == Ranking([3, 0, 2], valid=True)


R = "<reason>r</reason>"


@pytest.mark.parametrize("text, error", [
    (R + "[2] > [1] > [3]", "missing <ranking>...</ranking>"),
    (R + "<ranking>[2] > [1] > [3]", "missing <ranking>...</ranking>"),
    (R + "<ranking>[2], [1], [3]</ranking>", "ranking is not of the form [i] > [j] > ..."),
    (R + "<ranking>[2] > [1]</ranking>", "expected 3 ids, got 2"),
    (R + "<ranking>[2] > [1] > [3] > [4]</ranking>", "expected 3 ids, got 4"),
    (R + "<ranking>[2] > [2] > [3]</ranking>", "duplicate ids"),
    (R + "<ranking>[2] > [6] > [3]</ranking>", "id 6 out of range 1..5"),
    (R + "<ranking>[0] > [1] > [3]</ranking>", "id 0 out of range 1..5"),
    # METHOD.md: missing tags make an output invalid, the reason's included
    ("<ranking>[2] > [1] > [3]</ranking>", "missing <reason>...</reason> before <ranking>"),
    ("<reason>r <ranking>[2] > [1] > [3]</ranking>", "missing <reason>...</reason> before <ranking>"),
    ("r</reason><ranking>[2] > [1] > [3]</ranking>", "missing <reason>...</reason> before <ranking>"),
    ("<ranking>[2] > [1] > [3]</ranking><reason>r</reason>", "missing <reason>...</reason> before <ranking>"),
])
def test_strict_parse_falls_back_to_retriever_top_k(text, error):
    assert parse_ranking(text, n=5, k=3) == Ranking([0, 1, 2], valid=False, error=error)


def test_lenient_keeps_valid_ids_in_order_and_fills_from_retriever_order():
    # 6 is out of range, the second 4 is a duplicate: keep 4, 2; fill with 0 (retriever's first unused)
    ranked = parse_ranking(R + "<ranking>[4] > [6] > [4] > [2]</ranking>", n=5, k=3, lenient=True)
    assert ranked == Ranking([3, 1, 0], valid=False, error="expected 3 ids, got 4")
    # without a reason the ids are kept all the same; only the strict verdict says invalid
    assert parse_ranking("<ranking>[3] > [1] > [2]</ranking>", 5, 3, lenient=True) == Ranking(
        [2, 0, 1], valid=False, error="missing <reason>...</reason> before <ranking>")
    # without tags the ids are read from the whole output; extra ids are cut at K
    assert parse_ranking("best: [5] then [3] then [1] [2]", n=5, k=3, lenient=True).permutation == [4, 2, 0]
    assert parse_ranking("no ids at all", n=5, k=3, lenient=True).permutation == [0, 1, 2]
    # lenient does not change a valid output
    assert parse_ranking(R + "<ranking>[3] > [1] > [2]</ranking>", 5, 3, lenient=True) == Ranking([2, 0, 1], True)


def test_fewer_candidates_than_k_needs_all_of_them():
    assert parse_ranking(R + "<ranking>[2] > [1]</ranking>", n=2, k=3) == Ranking([1, 0], valid=True)
    assert top_k(2, 3) == [0, 1]


def test_oracle_promotes_answer_bearing_candidates_in_retriever_order():
    assert oracle([False, True, False, True, False], 3) == [1, 3, 0]
    assert oracle([False, False, False, False], 3) == [0, 1, 2]  # unchanged when none has the answer
    assert oracle([True, True, True, True], 2) == [0, 1]
    assert oracle([False, False, False, False, True], 5) == [4, 0, 1, 2, 3]


def test_prompt_numbers_candidates_and_names_k():
    tokenizer = load_tokenizer("smollm2")
    passages = [Passage("x", "Paris", "Paris is the capital of France."), Passage("y", "Lyon", "A city.")]
    text = tokenizer.decode(prompt_ids(tokenizer, "capital of france?", "france capital", passages, 2, 32))
    assert "[1] Paris: Paris is the capital of France.\n[2] Lyon: A city." in text
    assert "Question: capital of france?\nSearch query: france capital" in text
    assert "exactly 2 distinct passage numbers" in text and "<ranking> [2] > [1] </ranking>" in text


def test_with_fewer_candidates_than_k_the_prompt_asks_for_what_the_parser_accepts():
    tokenizer = load_tokenizer("smollm2")
    passages = [Passage("x", "Paris", "Paris is the capital of France."), Passage("y", "Lyon", "A city.")]
    text = tokenizer.decode(prompt_ids(tokenizer, "capital of france?", "france capital", passages, 5, 32))
    assert "Choose the 2 passages" in text and "exactly 2 distinct passage numbers" in text
    assert "exactly 5" not in text and "<ranking> [2] > [1] </ranking>" in text
    # and the parser accepts exactly that many
    assert parse_ranking("<reason>r</reason><ranking>[2] > [1]</ranking>", n=2, k=5).valid
