"""bench/ranker_warmup_summary.py: calls a ranker put in another order than the retriever, counted by hand."""

import sys

import polars as pl
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from ranker_warmup_summary import (changed_calls, demonstrated_first_positions, first_choices,  # noqa: E402
                                   hit1_by_visibility, relative)


def test_changed_calls_and_their_hit1_moves_are_counted_per_call():
    rows = [  # call, order, permutation, hit1 (None: no answer-bearing candidate, not scored)
        ("a", "ranker", [0, 1, 2], 1.0), ("a", "retriever", [0, 1, 2], 1.0),  # same order
        ("b", "ranker", [1, 0, 2], 1.0), ("b", "retriever", [0, 1, 2], 0.0),  # changed, now a hit
        ("c", "ranker", [2, 0, 1], 0.0), ("c", "retriever", [0, 1, 2], 1.0),  # changed, hit lost
        ("d", "ranker", [1, 0, 2], 0.0), ("d", "retriever", [0, 1, 2], 0.0),  # changed, still a miss
        ("e", "ranker", [0, 2, 1], None), ("e", "retriever", [0, 1, 2], None),  # changed, not scored
        ("e", "baseline", [2, 1, 0], None),
    ]
    frame = pl.DataFrame([dict(call_id=c, order=o, permutation=p, hit1=h) for c, o, p, h in rows])
    assert changed_calls(frame) == {"calls_in_another_order_than_the_retriever": 4,
                                    "of_those_with_an_answer_bearing_candidate": 3, "hit1_higher": 1,
                                    "hit1_lower": 1}
    # first positions (1-based): ranker 1, 2, 3, 2, 1 -> "1": 2, "2": 2, "3": 1; baseline 3
    assert first_choices(frame) == {"1": 2, "2": 2, "3": 1}
    assert first_choices(frame, "baseline") == {"3": 1} and first_choices(frame.clear()) == {}


def test_paths_inside_the_working_folder_become_relative(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert relative(str(tmp_path / "indexes" / "x")) == "indexes/x"
    assert relative("/elsewhere/x") == "/elsewhere/x" and relative(3) == 3 and relative("runs/a") == "runs/a"


def test_hit1_is_split_by_whether_the_ranker_could_see_an_answer():
    rows = [  # call, order, hit1
        ("a", "ranker", 1.0), ("a", "retriever", 0.0),  # in view
        ("b", "ranker", 1.0), ("b", "retriever", 1.0),  # in view
        ("c", "ranker", 0.0), ("c", "retriever", 1.0),  # in view
        ("d", "ranker", 0.0), ("d", "retriever", 1.0),  # out of view
        ("e", "ranker", None), ("e", "retriever", None),  # in view but not scored
    ]
    frame = pl.DataFrame([dict(call_id=c, order=o, hit1=h) for c, o, h in rows])
    split = hit1_by_visibility(frame, {"a": True, "b": True, "c": True, "d": False, "e": True})
    # in view: ranker 2 of 3, retriever 2 of 3; out of view: ranker 0 of 1, retriever 1 of 1
    assert split == {"answer_in_view": {"calls": 3, "ranker": 0.667, "retriever": 0.667},
                     "answer_out_of_view": {"calls": 1, "ranker": 0.0, "retriever": 1.0}}
    assert hit1_by_visibility(frame, {"d": True}) == {"answer_in_view": {"calls": 1, "ranker": 0.0, "retriever": 1.0},
                                                       "answer_out_of_view": {"calls": 0}}


def test_demonstrated_first_positions_read_the_ranking_not_the_reason():
    from cosearch_cli.ranker import RANKING_OPEN

    outputs = [f" [3] mentions Lyon. {RANKING_OPEN} [1] > [3] > [2]", f"{RANKING_OPEN}[2] > [1]",
               f"{RANKING_OPEN} [1] > [2]", "no ranking here"]
    assert demonstrated_first_positions(outputs) == {"1": 2, "2": 1, "unparsed": 1}
