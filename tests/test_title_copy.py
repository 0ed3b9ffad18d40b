"""bench/title_copy.py: which answers copy a shown passage's title or repeat the question."""

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from title_copy import changes, copies_title, repeats_question  # noqa: E402


def test_repeats_question_needs_four_words_mostly_from_the_question():
    question = "Who plays Yoda in Revenge of the Sith?"
    assert repeats_question("who plays yoda in revenge of the sith", question)  # 6 words, all asked
    # normalised "yoda actor in revenge of sith": 6 words, 5 of them asked -> 5/6 >= 0.8
    assert repeats_question("Yoda actor in Revenge of the Sith", question)
    # "frank oz plays yoda": 4 words, 2 asked -> 0.5 < 0.8
    assert not repeats_question("Frank Oz plays Yoda", question)
    assert not repeats_question("Revenge of Sith", question)  # 3 words: too short to count
    assert not repeats_question(None, question)


def test_copies_title_compares_with_the_shown_passages_titles():
    titles = {"p1": "kickass", "p2": "aaron taylorjohnson"}  # normalised titles: punctuation dropped
    shown = {"answer": "Kick-Ass!", "turns": [{"observation_ids": ["p1"]}]}
    assert copies_title(shown, titles)
    assert not copies_title(shown | {"answer": "Aaron Taylor-Johnson"}, titles)  # p2 was not shown
    assert not copies_title(shown | {"answer": None}, titles)


def test_changes_count_answers_queries_and_f1_direction():
    before = {("q1", 0): ("a", ["x"], 0.0), ("q2", 0): ("b", ["y"], 1.0), ("q3", 0): ("c", ["z"], 0.5)}
    after = {("q1", 0): ("a2", ["x"], 1.0), ("q2", 0): ("b2", ["y2"], 0.0), ("q3", 0): ("c", ["z2"], 0.5)}
    assert changes(before, after) == {"answers_changed": 2, "f1_higher": 1, "f1_lower": 1, "queries_changed": 2}
