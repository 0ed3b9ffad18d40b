"""Study 8's helpers: bench/gain_by_visibility.py's split of held-out questions by what the starting agent was
shown, bench/learning_evidence.py's embedding of other figures into its results JSON, and bench/ranker_room.py's
count of what a ranker could add to the retriever's top K."""

import sys
from types import SimpleNamespace as NS

import orjson
import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from gain_by_visibility import shown_ids  # noqa: E402
from learning_evidence import embed  # noqa: E402
from ranker_room import room  # noqa: E402
from test_answerable_pool import WordTokenizer  # noqa: E402


class Docs:
    def __init__(self, texts):
        self.texts = texts

    def get(self, ids):
        return [NS(id=i, text=self.texts[i]) for i in ids]


def record(qid, answers, *observations):
    turns = [NS(observation_ids=list(ids)) for ids in observations] + [NS(observation_ids=[])]
    return NS(question_id=qid, answers=answers, trajectories=[NS(turns=turns)])


def test_shown_ids_count_an_answer_only_within_the_budget_of_a_shown_passage():
    docs = Docs({"early": "Paris is the capital", "late": "one two three four five Paris", "none": "nothing here"})
    records = [record("q1", ["Paris"], ["none", "early"]),   # shown in the first words of the second passage
               record("q2", ["Paris"], ["late"]),            # only after the budget
               record("q3", ["Paris"], ["none"], ["late"]),  # a second search's passages count too: still late
               record("q4", ["Paris"]),                      # answered without searching
               record("q5", ["yes"], ["early"])]             # not contained
    assert shown_ids(records, docs, WordTokenizer(), 4) == {"q1"}
    assert shown_ids(records, docs, WordTokenizer(), 6) == {"q1", "q2", "q3"}


def test_embed_adds_each_files_content_under_its_name(tmp_path):
    extra = tmp_path / "v.json"
    extra.write_bytes(orjson.dumps({"subsets": {"all": 1}}))
    out = embed({"presets": []}, [f"gain_by_visibility={extra}"])
    assert out == {"presets": [], "gain_by_visibility": {"subsets": {"all": 1}}}
    with pytest.raises(SystemExit, match="NAME=FILE"):
        embed({}, [str(extra)])


def test_room_reads_the_answer_flags_at_each_depth():
    flags = [False, False, False, False, True, False, True]  # answers at ranks 5 and 7
    assert room(flags, 3, 3) == {"in_top_k": False, "only_beyond_k": False, "not_first": False}
    assert room(flags, 3, 5) == {"in_top_k": False, "only_beyond_k": True, "not_first": True}
    assert room([False, True, False, True], 3, 4) == {"in_top_k": True, "only_beyond_k": False,
                                                      "not_first": True}
    assert room([True, False], 3, 5) == {"in_top_k": True, "only_beyond_k": False, "not_first": False}
    assert room([], 3, 5) == {"in_top_k": False, "only_beyond_k": False, "not_first": False}
