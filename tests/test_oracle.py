"""The oracle study: promotion on crafted candidates, resume of each half, Table 1 numbers by hand."""

from __future__ import annotations

import itertools

import orjson
import pytest
from test_evaluate import make_record

from cosearch_cli.errors import ConfigError
from cosearch_cli.oracle import (ORACLE, StudyFolder, finished_in_every_half, interleave, relative_gap, run_study,
                                 study_halves, summarize, table1_markdown)
from cosearch_cli.records import Question

# --- the oracle ranker's promotion (cosearch_cli.ranker.oracle) ----------------------------------------


def test_oracle_promotes_answer_bearing_candidates_in_retriever_order():
    from cosearch_cli.ranker import oracle

    # Candidates 1 and 3 hold the answer: they go first (1 before 3), then the dense order fills up.
    assert oracle([False, True, False, True, False], 3) == [1, 3, 0]
    # An answer-bearing candidate far down the list still reaches the top.
    assert oracle([False] * 9 + [True], 5) == [9, 0, 1, 2, 3]


def test_oracle_changes_nothing_without_an_answer_bearing_candidate():
    from cosearch_cli.ranker import oracle, top_k

    assert oracle([False] * 6, 5) == top_k(6, 5) == [0, 1, 2, 3, 4]


def test_oracle_with_more_answer_bearing_candidates_than_k_keeps_the_first_k():
    from cosearch_cli.ranker import oracle

    assert oracle([True, False, True, True, True], 3) == [0, 2, 3]
    assert oracle([True, False], 5) == [0, 1]  # fewer candidates than K


# --- halves ----------------------------------------------------------------------------------------------


def test_halves_put_the_oracle_last_and_refuse_other_rankers():
    assert study_halves(["none", "llm", "none"]) == ["none", "llm", ORACLE]
    with pytest.raises(ConfigError, match="not a standard ranker"):
        study_halves(["oracle"])
    with pytest.raises(ConfigError):
        study_halves([])


# --- running and resuming --------------------------------------------------------------------------------

QUESTIONS = [Question(id=f"q{i}", question=f"question {i}", answers=[f"a{i}"], dataset=d)
             for i, d in enumerate(["nq", "nq", "hotpotqa", "hotpotqa"])]


def fake_rollouts(asked: list, fail_after: int | None = None):
    """Standard rankers answer NQ right and HotpotQA wrong; the oracle answers everything right."""

    def rollouts(half, questions):
        for i, q in enumerate(questions):
            if fail_after is not None and i == fail_after:
                raise RuntimeError("killed")
            asked.append((half, q.id))
            right = half == ORACLE or q.dataset == "nq"
            yield make_record(q.id, q.dataset, q.answers, [(q.answers[0] if right else "wrong", 1, True)],
                              ranker=half)

    return rollouts


def manifests(half):
    return {"kind": "manifest", "stage": "oracle", "half": half}


def ticks():
    counter = itertools.count()
    return lambda: float(next(counter))


def test_interrupted_half_continues_with_the_questions_it_lacks(tmp_path):
    folder = StudyFolder(tmp_path)
    asked: list = []
    with pytest.raises(RuntimeError):
        run_study(QUESTIONS, ["none", ORACLE], folder, fake_rollouts(asked, fail_after=2), manifests, ticks())
    assert asked == [("none", "q0"), ("none", "q1")]
    assert len(folder.partial("none").read_bytes().splitlines()) == 2 and not folder.final("none").exists()

    asked.clear()
    records = run_study(QUESTIONS, ["none", ORACLE], StudyFolder(tmp_path), fake_rollouts(asked), manifests,
                        ticks())
    assert asked == [("none", "q2"), ("none", "q3")] + [(ORACLE, q.id) for q in QUESTIONS]
    assert [r.question_id for r in records["none"]] == ["q0", "q1", "q2", "q3"]
    assert not folder.partial("none").exists()
    assert orjson.loads(tmp_path.joinpath("none.manifest.json").read_bytes())["half"] == "none"


def test_finished_half_is_not_recomputed(tmp_path):
    asked: list = []
    run_study(QUESTIONS, ["none", ORACLE], StudyFolder(tmp_path), fake_rollouts(asked), manifests, ticks())
    asked.clear()
    records = run_study(QUESTIONS, ["llm", ORACLE], StudyFolder(tmp_path), fake_rollouts(asked), manifests,
                        ticks())
    assert asked == [("llm", q.id) for q in QUESTIONS]  # the oracle half came from the folder
    assert [r.question_id for r in records[ORACLE]] == ["q0", "q1", "q2", "q3"]


def test_a_torn_last_line_is_dropped_and_rerun(tmp_path):
    folder = StudyFolder(tmp_path)
    asked: list = []
    with pytest.raises(RuntimeError):
        run_study(QUESTIONS, ["none", ORACLE], folder, fake_rollouts(asked, fail_after=1), manifests, ticks())
    with open(folder.partial("none"), "ab") as handle:
        handle.write(b'{"kind": "rollout", "question_id": "q1", "trunc')  # killed mid-write
    asked.clear()
    run_study(QUESTIONS, ["none", ORACLE], StudyFolder(tmp_path), fake_rollouts(asked), manifests, ticks())
    assert asked[:3] == [("none", "q1"), ("none", "q2"), ("none", "q3")]


def test_seconds_accumulate_across_resumes(tmp_path):
    folder = StudyFolder(tmp_path)
    with pytest.raises(RuntimeError):
        run_study(QUESTIONS, ["none", ORACLE], folder, fake_rollouts([], fail_after=2), manifests, ticks())
    assert folder.seconds["none"] == 2.0  # the fake clock ticks one second per call
    run_study(QUESTIONS, ["none", ORACLE], StudyFolder(tmp_path), fake_rollouts([]), manifests, ticks())
    assert StudyFolder(tmp_path).seconds["none"] == 4.0
    assert orjson.loads(tmp_path.joinpath("none.manifest.json").read_bytes())["wall_seconds"] == 4.0


def test_settings_must_match_to_resume(tmp_path):
    folder = StudyFolder(tmp_path)
    folder.check_settings("none", {"max_turns": 2})
    folder.check_settings("none", {"max_turns": 2})
    with pytest.raises(ConfigError, match=r"other settings \(max_turns\)"):
        folder.check_settings("none", {"max_turns": 3})
    folder.remove("none")
    folder.check_settings("none", {"max_turns": 3})


def test_interleave_round_robins_datasets():
    order = [q.id for q in interleave(QUESTIONS + [Question("q4", "?", ["a"], "hotpotqa")])]
    assert order == ["q0", "q2", "q1", "q3", "q4"]


def test_blocks_advance_the_halves_together(tmp_path):
    asked: list = []
    inner = fake_rollouts(asked)

    def killed_after_three(half, questions):
        for record in inner(half, questions):
            if len(asked) > 3:
                raise RuntimeError("killed")
            yield record

    with pytest.raises(RuntimeError):
        run_study(QUESTIONS, ["none", ORACLE], StudyFolder(tmp_path), killed_after_three, manifests, ticks(),
                  block=1)
    # Block 1: none q0, oracle q0; block 2: none q1, then killed while the oracle ran q1.
    assert asked == [("none", "q0"), (ORACLE, "q0"), ("none", "q1"), (ORACLE, "q1")]
    paired = finished_in_every_half(QUESTIONS, ["none", ORACLE], StudyFolder(tmp_path))
    assert [r.question_id for r in paired["none"]] == ["q0"] and [r.question_id for r in paired[ORACLE]] == ["q0"]
    asked.clear()
    records = run_study(QUESTIONS, ["none", ORACLE], StudyFolder(tmp_path), fake_rollouts(asked), manifests,
                        ticks(), block=1)
    assert asked == [(ORACLE, "q1"), ("none", "q2"), (ORACLE, "q2"), ("none", "q3"), (ORACLE, "q3")]
    assert [r.question_id for r in records[ORACLE]] == ["q0", "q1", "q2", "q3"]


# --- Table 1 ---------------------------------------------------------------------------------------------


def test_table1_by_hand(tmp_path):
    records = run_study(QUESTIONS, ["none", ORACLE], StudyFolder(tmp_path), fake_rollouts([]), manifests, ticks())
    result = summarize(records, bootstrap=200)
    rows = {r["ranker"]: r for r in result.table}
    # none: NQ F1 1, HotpotQA F1 0 -> single 1, multi 0, average (1 + 0) / 2 = .5. Oracle: 1 everywhere.
    assert (rows["none"]["single-hop"], rows["none"]["multi-hop"], rows["none"]["average"]) == (1.0, 0.0, 0.5)
    assert (rows[ORACLE]["single-hop"], rows[ORACLE]["multi-hop"], rows[ORACLE]["average"]) == (1.0, 1.0, 1.0)
    assert rows["none"]["gap average"] == 1.0  # (1 - .5) / .5
    assert rows["none"]["gap single-hop"] == 0.0 and rows["none"]["gap multi-hop"] is None  # 0 -> undefined
    assert (rows["none"]["oracle - this (avg F1)"], rows["none"]["ci_low"], rows["none"]["ci_high"]) == (0.5,) * 3
    text = table1_markdown(result.table)
    assert "| none | 1.000 | 0.000 | 0.500 | +100.0% | +0.500 [+0.500, +0.500] |" in text


def test_relative_gap_matches_the_paper():
    assert relative_gap(0.546, 0.626) == pytest.approx(0.1465, abs=1e-4)  # 7B: +14.7%
    assert relative_gap(0.440, 0.558) == pytest.approx(0.2682, abs=1e-4)  # 3B: +26.8%
    assert relative_gap(0.0, 0.3) is None and relative_gap(None, 0.3) is None
