"""Evaluation on hand-written rollouts: every expected number below is worked out by hand in the comments."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pytest

from cosearch_cli.evaluate import compare, evaluate, hop_of, mean_ci, paired_bootstrap
from cosearch_cli.records import RankerCall, RolloutRecord, Trajectory


def make_record(qid: str, dataset: str, answers: list[str], trajectories: list[tuple],
                calls: list[tuple] = (), ranker: str = "none", sampling: dict | None = None) -> RolloutRecord:
    """trajectories: (answer, n_searches, format_ok); calls: (candidate_has_answer, permutation, valid)."""
    trajs = [Trajectory(sample=i, turns=[], answer=a, n_searches=n, format_ok=ok, token_ids=[], loss_mask=[],
                        logprobs=[], prompt_len=0) for i, (a, n, ok) in enumerate(trajectories)]
    ranker_calls = []
    for t, (has, perm, valid) in enumerate(calls):
        ids = [f"p{i}" for i in range(len(has))]
        ranker_calls.append(RankerCall(id=f"{qid}/s0/t{t}", sample=0, turn=t, query="q", ranker=ranker,
                                       candidate_ids=ids, candidate_scores=[1.0] * len(has),
                                       candidate_has_answer=list(has), permutation=list(perm),
                                       chosen_ids=[ids[i] for i in perm], valid=valid))
    return RolloutRecord(question_id=qid, question=f"question {qid}", answers=answers, dataset=dataset,
                         trajectories=trajs, ranker_calls=ranker_calls, sampling=sampling or {})


def hand_run() -> list[RolloutRecord]:
    return [
        # q1: exact answer, one call whose first chosen passage holds the answer.
        make_record("q1", "nq", ["Paris"], [("Paris", 1, True)], [([False, True, False], [1, 0], True)]),
        # q2: two samples. "Dylan": P=1, R=1/2 -> F1 2/3, SubEM 0. "Bob Dylan singer": P=2/3, R=1 -> F1 .8,
        # SubEM 1. Call 1 finds the answer at rank 3; call 2 is invalid and holds no answer.
        make_record("q2", "nq", ["Bob Dylan"], [("Dylan", 2, True), ("Bob Dylan singer", 0, False)],
                    [([False, False, True], [0, 1, 2], True), ([False, False], [0, 1], False)]),
        # q3: "yes it is" vs "yes": F1 = 2 * 1/3 * 1 / (4/3) = .5 without the yes/no rule, 0 with it.
        make_record("q3", "hotpotqa", ["yes"], [("yes it is", 0, True)]),
        # q4: no answer at all.
        make_record("q4", "bamboogle", ["1797"], [(None, 3, False)]),
    ]


def rows_by_name(evaluation) -> dict[str, dict]:
    return {r["dataset"]: r for r in evaluation.datasets + evaluation.groups}


def test_per_question_scores_are_means_over_samples():
    scores = {s.question_id: s for s in evaluate(hand_run()).questions}
    q2 = scores["q2"]
    assert q2.samples == 2
    assert q2.em == 0.0
    assert q2.f1 == pytest.approx((2 / 3 + 0.8) / 2)
    assert q2.subem == 0.5
    assert q2.searches == 1.0 and q2.format_ok == 0.5
    assert q2.hits == {1: 0, 3: 1, 5: 1} and q2.invalid_calls == 1 and q2.calls_with_answer == 1
    row = q2.row()
    assert row["hit@1"] == 0.0 and row["hit@3"] == 0.5 and row["predictions"] == ["Dylan", "Bob Dylan singer"]
    assert scores["q3"].row()["hit@1"] is None  # no ranker calls: undefined, not 0


def test_dataset_rows_by_hand():
    rows = rows_by_name(evaluate(hand_run()))
    nq = rows["nq"]
    assert nq["questions"] == 2 and nq["trajectories"] == 3
    assert nq["em"] == 0.5
    assert nq["f1"] == pytest.approx((1 + (2 / 3 + 0.8) / 2) / 2)
    assert nq["subem"] == 0.75
    assert nq["searches"] == 1.0
    assert nq["format_fail"] == 0.25
    # Pooled over the 3 calls: Hit@1 only q1's call; Hit@3 q1's and q2's first call.
    assert nq["ranker_calls"] == 3
    assert nq["hit@1"] == pytest.approx(1 / 3)
    assert nq["hit@3"] == pytest.approx(2 / 3) and nq["hit@5"] == pytest.approx(2 / 3)
    assert nq["invalid"] == pytest.approx(1 / 3)
    assert nq["answer_in_candidates"] == pytest.approx(2 / 3)
    assert rows["hotpotqa"]["f1"] == 0.5 and rows["hotpotqa"]["subem"] == 1.0
    assert rows["hotpotqa"]["hit@1"] is None
    assert rows["bamboogle"]["f1"] == 0.0 and rows["bamboogle"]["format_fail"] == 1.0


def test_groups_are_unweighted_means_over_datasets():
    rows = rows_by_name(evaluate(hand_run()))
    nq_f1 = (1 + (2 / 3 + 0.8) / 2) / 2
    assert rows["single-hop"]["f1"] == pytest.approx(nq_f1)
    assert rows["multi-hop"]["f1"] == pytest.approx((0.5 + 0.0) / 2)
    # The average is over the three datasets, not over the two hop groups and not over questions.
    assert rows["average"]["f1"] == pytest.approx((nq_f1 + 0.5 + 0.0) / 3)
    assert rows["average"]["datasets"] == 3 and rows["average"]["questions"] == 4
    # Ranker figures average over datasets that had calls (only nq here).
    assert rows["average"]["hit@1"] == pytest.approx(1 / 3)


def test_paper_split_and_order():
    assert [hop_of(d) for d in ("nq", "triviaqa", "popqa")] == ["single"] * 3
    assert [hop_of(d) for d in ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")] == ["multi"] * 4
    records = [make_record("a", "musique", ["x"], [("x", 0, True)]), make_record("b", "popqa", ["x"], [("y", 0, True)])]
    assert [r["dataset"] for r in evaluate(records).datasets] == ["popqa", "musique"]


def test_yes_no_rule_changes_the_score_and_is_named():
    plain = evaluate(hand_run())
    ruled = evaluate(hand_run(), yes_no_rule=True)
    assert rows_by_name(plain)["hotpotqa"]["f1"] == 0.5
    assert rows_by_name(ruled)["hotpotqa"]["f1"] == 0.0
    assert plain.variant["yes_no_rule"] is False and ruled.variant["yes_no_rule"] is True
    assert "yes/no rule on" in ruled.summary()["variant_name"]
    assert "yes/no rule off" in plain.summary()["variant_name"]


def test_ranker_parse_mode_is_read_from_the_rollout():
    # `cosearch rollout` records RolloutConfig.lenient_ranker in every record's `sampling`.
    lenient = [make_record("a", "nq", ["x"], [("x", 0, True)], sampling={"lenient_ranker": True, "k": 3})]
    assert evaluate(lenient).variant["ranker_parse"] == "lenient"
    assert evaluate(lenient).variant["rollout_settings"] == [{"lenient_ranker": True, "k": 3}]
    assert evaluate(hand_run()).variant["ranker_parse"] == "unrecorded"
    mixed = lenient + [make_record("b", "nq", ["x"], [("x", 0, True)], sampling={"lenient_ranker": False})]
    assert evaluate(mixed).variant["ranker_parse"] == "lenient+strict"
    assert "parse lenient+strict" in evaluate(mixed).summary()["variant_name"]


# --- paired bootstrap ----------------------------------------------------------------------------------


def test_bootstrap_of_constant_differences_is_exact():
    out = paired_bootstrap({"nq": np.array([0.25, 0.25, 0.25])}, samples=200, seed=1)
    assert out["nq"] == {"diff": 0.25, "ci_low": 0.25, "ci_high": 0.25, "share_positive": 1.0}


def test_bootstrap_two_questions_by_hand():
    # Differences 0 and 1: a replicate's mean is 0, .5 or 1 with probabilities 1/4, 1/2, 1/4. The 2.5th
    # percentile is therefore 0 and the 97.5th is 1, and 3/4 of replicates are positive.
    out = paired_bootstrap({"nq": np.array([0.0, 1.0])}, samples=4000, seed=0)
    assert out["nq"]["diff"] == 0.5
    assert out["nq"]["ci_low"] == 0.0 and out["nq"]["ci_high"] == 1.0
    assert out["nq"]["share_positive"] == pytest.approx(0.75, abs=0.03)


def test_weighted_bootstrap_of_constant_differences_is_exact():
    # A question's value is its mean call difference, its weight its number of calls: all equal -> no spread.
    out = paired_bootstrap({"nq": np.array([0.5, 0.5, 0.5])}, weights={"nq": np.array([1, 2, 5])}, samples=200)
    assert out["nq"] == {"diff": 0.5, "ci_low": 0.5, "ci_high": 0.5, "share_positive": 1.0}


def test_weighted_bootstrap_pools_calls_and_resamples_questions():
    # q1: +1 on 1 call, q2: 0 on 3 calls. Pooled over calls the difference is 1/4 (unweighted it would be 1/2).
    # A replicate draws two questions: q1 twice -> 1 (p 1/4), q2 twice -> 0 (p 1/4), one each -> 1/4 (p 1/2).
    out = paired_bootstrap({"nq": np.array([1.0, 0.0])}, weights={"nq": np.array([1, 3])}, samples=4000, seed=0)
    assert out["nq"]["diff"] == 0.25
    assert out["nq"]["ci_low"] == 0.0 and out["nq"]["ci_high"] == 1.0
    assert out["nq"]["share_positive"] == pytest.approx(0.75, abs=0.03)


def test_bootstrap_groups_are_means_of_datasets_per_replicate():
    out = paired_bootstrap({"hotpotqa": np.zeros(5), "nq": np.ones(4)}, samples=100, seed=3)
    assert (out["single-hop"]["ci_low"], out["single-hop"]["ci_high"]) == (1.0, 1.0)
    assert (out["multi-hop"]["ci_low"], out["multi-hop"]["ci_high"]) == (0.0, 0.0)
    assert (out["average"]["diff"], out["average"]["ci_low"], out["average"]["ci_high"]) == (0.5, 0.5, 0.5)


def test_bootstrap_is_seeded_and_independent_of_dict_order():
    diffs = {"nq": np.array([0.0, 1.0, 0.5, -0.5]), "musique": np.array([1.0, 0.0, 0.0])}
    reordered = {"musique": diffs["musique"], "nq": diffs["nq"]}
    assert paired_bootstrap(diffs, samples=300, seed=7) == paired_bootstrap(reordered, samples=300, seed=7)
    assert paired_bootstrap(diffs, samples=300, seed=7) != paired_bootstrap(diffs, samples=300, seed=8)


def test_mean_ci_of_one_run_by_hand():
    # One run's mean (a curve's point), not a difference. Values 0 and 1: replicate means 0, .5, 1 with
    # probabilities 1/4, 1/2, 1/4, so the 95% interval is [0, 1]; equal values give a zero-width interval.
    assert mean_ci([0.0, 1.0], samples=4000) == (0.0, 1.0)
    assert mean_ci([0.3, 0.3, 0.3]) == (0.3, 0.3)
    assert mean_ci([]) is None
    # Pooled over calls: q1 one call at 1, q2 three calls at 0 (mean 1/4); whole questions are resampled, so a
    # replicate is 1, 1/4 or 0, and the 90% interval (5th to 95th percentile) is still [0, 1].
    assert mean_ci([1.0, 0.0], [1, 3], samples=4000, confidence=0.9) == (0.0, 1.0)
    # The refactor shared with paired_bootstrap draws the same replicates for the same seed.
    assert mean_ci([0.0, 1.0, 0.5, 0.25], seed=5) == tuple(
        paired_bootstrap({"nq": np.array([0.0, 1.0, 0.5, 0.25])}, seed=5)["nq"][k] for k in ("ci_low", "ci_high"))


def test_compare_pairs_questions_by_id():
    a = evaluate(hand_run())
    better = hand_run()
    better[3] = make_record("q4", "bamboogle", ["1797"], [("1797", 1, True)])  # bamboogle F1 0 -> 1
    b = evaluate(list(reversed(better)))  # order in the file must not matter
    result = compare(a, b, samples=500, seed=0)
    diff = {r["dataset"]: r for r in result.differences}
    assert diff["bamboogle"]["f1_diff"] == 1.0
    assert (diff["bamboogle"]["f1_ci_low"], diff["bamboogle"]["f1_ci_high"]) == (1.0, 1.0)
    assert diff["nq"]["f1_diff"] == 0.0
    assert diff["multi-hop"]["f1_diff"] == pytest.approx(0.5)
    assert diff["average"]["f1_diff"] == pytest.approx(1 / 3)
    q4 = next(q for q in result.questions if q["question_id"] == "q4")
    assert (q4["f1_a"], q4["f1_b"], q4["f1_diff"]) == (0.0, 1.0, 1.0)


def test_compare_ci_does_not_depend_on_the_order_the_questions_finished_in():
    # Rollouts write questions as they finish, so two runs of the same trajectories at other batch sizes list
    # them in another order; the bootstrap must resample the same per-question differences either way.
    before = [make_record(f"q{i}", "nq", ["yes"], [("no", 1, True)]) for i in range(6)]
    after = [make_record(f"q{i}", "nq", ["yes"], [("yes" if i % 2 else "no", 1, True)]) for i in range(6)]
    forward = compare(evaluate(before), evaluate(after), samples=200, seed=3).differences
    backward = compare(evaluate(before[::-1]), evaluate(after[3:] + after[:3]), samples=200, seed=3).differences
    row = next(r for r in forward if r["dataset"] == "nq")
    assert row["f1_diff"] == 0.5 and row["f1_ci_low"] < 0.5 < row["f1_ci_high"]  # a real interval
    assert forward == backward


def test_records_round_trip_through_dicts():
    # The CLI reads these records back from JSON; the dict form must parse into the same scores.
    from cosearch_cli.records import read_rollout

    records = [read_rollout(asdict(r), "x", i) for i, r in enumerate(hand_run())]
    assert rows_by_name(evaluate(records))["nq"] == rows_by_name(evaluate(hand_run()))["nq"]
