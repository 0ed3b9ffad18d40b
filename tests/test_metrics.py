"""Hand-computed cases for the shared text metrics."""

import pytest

from cosearch_cli.metrics import (answer_scores, exact_match, has_answer, normalize_answer, substring_match,
                                  token_f1)


@pytest.mark.parametrize("raw, expected", [
    ("The Eiffel Tower!", "eiffel tower"),
    ("  an   apple, a PEAR  ", "apple pear"),
    ("Théâtre", "théâtre"),  # accents survive; only case, punctuation and articles change
    ("U.S.A.", "usa"),
    ("the", ""),
    ("", ""),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match_takes_any_alias():
    assert exact_match("the Beatles", ["Rolling Stones", "Beatles"]) == 1.0
    assert exact_match("Beatles band", ["Beatles"]) == 0.0
    assert exact_match("", ["Beatles"]) == 0.0


def test_substring_match():
    assert substring_match("It was Paris, France.", ["Paris"]) == 1.0
    assert substring_match("Pari", ["Paris"]) == 0.0
    # an alias that normalises to nothing never matches
    assert substring_match("anything", ["The"]) == 0.0


def test_token_f1_hand_computed():
    # pred tokens: barack obama ; gold tokens: barack hussein obama -> overlap 2, P=1, R=2/3, F1=0.8
    assert token_f1("Barack Obama", ["Barack Hussein Obama"]) == pytest.approx(0.8)
    # best alias wins: "obama" vs ["barack obama" (P=1,R=.5 -> .6667), "obama" (1.0)]
    assert token_f1("Obama", ["Barack Obama", "Obama"]) == pytest.approx(1.0)
    # repeated tokens count with multiplicity: pred "new new york" vs "new york": overlap 2, P=2/3, R=1 -> 0.8
    assert token_f1("new new york", ["New York"]) == pytest.approx(0.8)
    assert token_f1("", ["Paris"]) == 0.0
    assert token_f1("Paris", []) == 0.0


def test_yes_no_rule_is_opt_in():
    # "no" vs "no way": plain F1 = overlap 1, P=1, R=.5 -> 0.6667; the HotpotQA rule makes it 0
    assert token_f1("no", ["no way"]) == pytest.approx(2 / 3)
    assert token_f1("no", ["no way"], yes_no_rule=True) == 0.0
    assert token_f1("yes", ["yes"], yes_no_rule=True) == 1.0


def test_answer_scores_none_prediction():
    assert answer_scores(None, ["x"]) == {"em": 0.0, "subem": 0.0, "f1": 0.0}
    assert answer_scores("Paris", ["paris"]) == {"em": 1.0, "subem": 1.0, "f1": 1.0}


def test_has_answer_token_subsequence():
    passage = "Barack Obama was born in Honolulu, Hawaii."
    assert has_answer(passage, ["Honolulu"])
    assert has_answer(passage, ["honolulu , hawaii"])  # punctuation is a token of its own
    assert not has_answer(passage, ["Honolul"])  # tokens, not substrings
    assert not has_answer(passage, ["Hawaii Honolulu"])  # order matters


def test_has_answer_unicode_nfd():
    # composed é in the passage, decomposed in the answer: NFD makes them equal
    assert has_answer("Le Théâtre de Paris", ["The\u0301a\u0302tre"])


def test_has_answer_never_for_yes_no():
    assert not has_answer("Yes, it is true, no doubt.", ["yes", "True", "no"])
    assert has_answer("Yes Minister aired in 1980.", ["yes", "1980"])
