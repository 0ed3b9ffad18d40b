"""Grouping with hand-worked sub-queries: normalisation, greedy clustering order, k_min conventions,
format-failure exclusion and the record checks. The record builders here are shared by the reward tests."""

from __future__ import annotations

from collections import Counter

import pytest

from cosearch_cli import grouping
from cosearch_cli.errors import ConfigError, RecordError
from cosearch_cli.metrics import token_f1
from cosearch_cli.records import RankerCall, RolloutRecord, Trajectory

N = 6
IDS = [f"d{i}" for i in range(N)]


def make_call(qid: str, sample: int, turn: int, query: str, has: tuple[int, ...] = (),
              perm: tuple[int, ...] = (0, 1, 2, 3, 4), valid: bool = True, ranker: str = "llm") -> RankerCall:
    """A call over candidates d0..d5; `has` lists the candidates holding a gold answer, `perm` the ones shown."""
    return RankerCall(id=f"{qid}/s{sample}/t{turn}", sample=sample, turn=turn, query=query, ranker=ranker,
                      candidate_ids=list(IDS), candidate_scores=[1.0 - i / 10 for i in range(N)],
                      candidate_has_answer=[i in has for i in range(N)], permutation=list(perm),
                      chosen_ids=[IDS[i] for i in perm], valid=valid)


def make_traj(sample: int, answer: str | None, format_ok: bool = True, turns=None) -> Trajectory:
    return Trajectory(sample=sample, turns=turns or [], answer=answer, n_searches=1, format_ok=format_ok,
                      token_ids=[5, 6, 7], loss_mask=[0, 1, 1], logprobs=[0.0, -0.1, -0.2], prompt_len=1,
                      format_error=None if format_ok else "turn 2 has no action tag")


def make_record(qid: str, answers: list[str], trajs: list[Trajectory], calls: list[RankerCall]) -> RolloutRecord:
    return RolloutRecord(question_id=qid, question=f"question {qid}?", answers=answers, dataset="nq",
                         trajectories=trajs, ranker_calls=calls)


def groups_by_id(record: RolloutRecord) -> dict:
    return {g.id: g for g in record.groups}


# --- normalisation and similarity -------------------------------------------------------------------------


@pytest.mark.parametrize("raw, expected", [
    ("What is the capital of France?", "what is capital of france"),
    ("An apple-pie's   origin", "apple pie s origin"),  # non-word characters become spaces
    ("THE U.S.A. (a country)", "u s country"),
    ("the a an", ""),
    ("theatre anna", "theatre anna"),  # articles only as whole words
])
def test_normalize_query(raw, expected):
    assert grouping.normalize_query(raw) == expected


@pytest.mark.parametrize("a, b", [
    ("capital of france", "france capital"),
    ("paris paris france", "paris france france city"),
    ("who wrote hamlet", "hamlet author"),
    ("x", "y"),
    ("one two three four", "four three two one"),
])
def test_unigram_f1_equals_metrics_token_f1_on_normalised_queries(a, b):
    ta, tb = a.split(), b.split()
    assert grouping.unigram_f1(Counter(ta), len(ta), Counter(tb), len(tb)) == pytest.approx(token_f1(a, [b]))


def test_clustering_order_and_boundary():
    queries = [
        "capital of France",    # c0
        "France capital city",  # vs c0: overlap 2, P=R=2/3 -> F1 .667 < .8 -> c1
        "capital France",       # vs c0: overlap 2, P=1, R=2/3 -> F1 exactly .8 -> joins c0
        "Who wrote Hamlet",     # c2
        "hamlet author",        # vs c2: overlap 1, P=1/2, R=1/3 -> .4 -> c3
        "the capital of france?",  # normalises to c0's representative
    ]
    assert grouping.cluster_queries(queries, tau=0.8) == [0, 1, 0, 2, 3, 0]
    assert grouping.cluster_queries(queries, tau=0.81) == [0, 1, 2, 3, 4, 0]


def test_clustering_joins_the_first_matching_cluster_and_compares_with_its_representative():
    queries = [
        "paris france capital",             # c0
        "paris france population",          # vs c0: 2/3, 2/3 -> .667 -> c1
        "paris france capital population",  # vs c0 and c1 alike: P=3/4, R=1 -> .857: the first, c0
        "france capital city",              # vs c0's representative .667 -> c2, though .857 with member 3
    ]
    assert grouping.cluster_queries(queries, tau=0.8) == [0, 1, 0, 2]


def test_identical_empty_queries_share_a_cluster():
    assert grouping.cluster_queries(["the", "?", "a b"], tau=0.8) == [0, 0, 1]


# --- grouping a record --------------------------------------------------------------------------------------


def small_record() -> RolloutRecord:
    trajs = [make_traj(0, "Paris"), make_traj(1, "Lyon"), make_traj(2, "Paris", format_ok=False)]
    calls = [  # deliberately out of (sample, turn) order
        make_call("q1", 1, 1, "paris population"),
        make_call("q1", 0, 0, "capital of France", has=(2,)),
        make_call("q1", 2, 0, "capital of france", has=(1,)),  # its trajectory failed the format check
        make_call("q1", 1, 0, "capital France", has=(0,)),
        make_call("q1", 0, 1, "population of Paris"),
    ]
    return make_record("q1", ["Paris"], trajs, calls)


def test_group_record_ids_members_and_exclusion():
    record = grouping.group_record(small_record(), grouping.GroupConfig(kmin=2))
    assert record.stage == "grouped"
    groups = groups_by_id(record)
    assert list(groups) == ["q1/agent", "q1/ranker/easy/c0", "q1/ranker/hard/c0",
                            "q1/ranker/excluded/agent-format-failure"]
    assert groups["q1/agent"].members == ["0", "1", "2"] and groups["q1/agent"].kept
    assert groups["q1/ranker/easy/c0"].members == ["q1/s0/t0", "q1/s1/t0"]
    # "population of paris" vs "paris population": overlap 2, P=2/3, R=1 -> .8 -> same cluster
    assert groups["q1/ranker/hard/c0"].members == ["q1/s0/t1", "q1/s1/t1"]
    excluded = groups["q1/ranker/excluded/agent-format-failure"]
    assert excluded.members == ["q1/s2/t0"] and not excluded.kept and excluded.reason == "agent-format-failure"
    assert all(t.group == "q1/agent" for t in record.trajectories)
    assert {c.id: c.group for c in record.ranker_calls}["q1/s2/t0"] == excluded.id
    assert {c.id: c.group for c in record.ranker_calls}["q1/s1/t1"] == "q1/ranker/hard/c0"


def test_format_failures_are_excluded_before_clustering_so_they_do_not_change_sizes():
    # with the failed trajectory's call counted, the easy cluster would have 3 members and pass k_min 3
    record = grouping.group_record(small_record(), grouping.GroupConfig(kmin=3))
    easy = groups_by_id(record)["q1/ranker/easy/c0"]
    assert len(easy.members) == 2 and not easy.kept and easy.reason == "below-kmin"


def kmin_record() -> RolloutRecord:
    trajs = [make_traj(s, "x") for s in range(4)]
    calls = [make_call("q2", s, 0, "same query", has=(0,)) for s in range(4)]  # easy: 4 members
    calls += [make_call("q2", s, 1, "other words") for s in range(3)]  # hard: 3 members
    calls += [make_call("q2", 3, 1, "lonely")]  # hard: a singleton
    return make_record("q2", ["x"], trajs, calls)


@pytest.mark.parametrize("strict, kept_easy4, kept_hard3", [(False, True, True), (True, True, False)])
def test_kmin_boundary_in_both_conventions(strict, kept_easy4, kept_hard3):
    groups = groups_by_id(grouping.group_record(kmin_record(), grouping.GroupConfig(kmin=3, kmin_strict=strict)))
    assert groups["q2/ranker/easy/c0"].kept is kept_easy4
    assert groups["q2/ranker/hard/c0"].kept is kept_hard3
    assert groups["q2/ranker/hard/c0"].reason == ("" if kept_hard3 else "below-kmin")
    assert groups["q2/ranker/hard/c1"].reason == "singleton" and not groups["q2/ranker/hard/c1"].kept


def test_a_singleton_never_trains_even_with_kmin_1():
    groups = groups_by_id(grouping.group_record(kmin_record(), grouping.GroupConfig(kmin=1)))
    assert groups["q2/ranker/hard/c1"].reason == "singleton"
    single = make_record("q3", ["x"], [make_traj(0, "x")], [])
    agent = groups_by_id(grouping.group_record(single, grouping.GroupConfig()))["q3/agent"]
    assert not agent.kept and agent.reason == "singleton"


def test_calls_without_a_trained_ranker_are_set_aside():
    record = make_record("q4", ["x"], [make_traj(0, "x"), make_traj(1, "y")],
                         [make_call("q4", 0, 0, "q", ranker="none"), make_call("q4", 1, 0, "q", ranker="oracle")])
    groups = groups_by_id(grouping.group_record(record, grouping.GroupConfig(kmin=2)))
    assert groups["q4/ranker/excluded/not-trained-ranker"].members == ["q4/s0/t0", "q4/s1/t0"]
    assert [g for g in groups if "/c" in g] == []


def test_regrouping_clears_stale_rewards():
    record = small_record()
    record.trajectories[0].reward, record.ranker_calls[0].advantage = 1.0, 0.5
    grouping.group_record(record, grouping.GroupConfig())
    assert record.trajectories[0].reward is None and record.ranker_calls[0].advantage is None


def test_presets_and_overrides():
    assert grouping.PRESETS["paper"] == grouping.GroupConfig(tau=0.8, kmin=3, kmin_strict=False)
    assert grouping.PRESETS["official"] == grouping.GroupConfig(tau=0.8, kmin=3, kmin_strict=True)
    config = grouping.resolve_config("official", kmin=2, tau=None)
    assert (config.kmin, config.kmin_strict, config.tau) == (2, True, 0.8)
    with pytest.raises(ConfigError, match="--tau"):
        grouping.resolve_config("paper", tau=0.0)
    with pytest.raises(ConfigError, match="--kmin"):
        grouping.resolve_config("paper", kmin=0)


# --- record checks ------------------------------------------------------------------------------------------


def test_check_rollout_names_the_problem():
    record = small_record()
    record.ranker_calls[0].candidate_has_answer = [True]
    with pytest.raises(RecordError, match=r"1 candidate_has_answer flags for 6 candidates") as info:
        grouping.check_rollout(record, "r.jsonl", 7)
    assert "r.jsonl:7:" in str(info.value)
    record = small_record()
    record.ranker_calls[0].sample = 9
    with pytest.raises(RecordError, match="sample 9, which has no trajectory"):
        grouping.check_rollout(record, "r.jsonl", 1)
    record = small_record()
    record.ranker_calls[0].chosen_ids = ["d0", "elsewhere"]
    with pytest.raises(RecordError, match="not among its candidates"):
        grouping.check_rollout(record, "r.jsonl", 1)


def test_check_grouped_refuses_inconsistent_groups():
    record = grouping.group_record(small_record(), grouping.GroupConfig(kmin=2))
    grouping.check_grouped(record, "g.jsonl", 1)
    record.ranker_calls[0].group = "q1/ranker/easy/c9"
    with pytest.raises(RecordError, match="missing or belongs to another group"):
        grouping.check_grouped(record, "g.jsonl", 1)
    ungrouped = small_record()
    with pytest.raises(RecordError, match="has no groups"):
        grouping.check_grouped(ungrouped, "g.jsonl", 1)
