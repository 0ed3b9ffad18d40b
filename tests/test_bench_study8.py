"""Study 8's helpers: bench/gain_by_visibility.py's split of held-out questions by what the starting agent was
shown, bench/learning_evidence.py's embedding of other figures into its results JSON, and bench/ranker_room.py's
count of what a ranker could add to the retriever's top K; bench/drawn_split.py (study 11)."""

import sys
from types import SimpleNamespace as NS

import orjson
import pytest

from conftest import ROOT, TextDocs as Docs

sys.path.insert(0, str(ROOT / "bench"))
from gain_by_visibility import read_split, shown_ids, subsets  # noqa: E402
from learning_evidence import embed, per_iteration  # noqa: E402
from ranker_room import room  # noqa: E402
from test_answerable_pool import WordTokenizer  # noqa: E402


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


def test_subsets_split_the_questions_by_what_was_shown_and_by_each_file(tmp_path):
    questions = tmp_path / "first.jsonl"
    questions.write_bytes(b'{"id": "q1", "question": "a?", "answers": ["a"]}\n\n'
                          b'{"id": "q3", "question": "c?", "answers": ["c"]}\n')
    name, ids = read_split(f"study 8's={questions}")
    assert (name, ids) == ("study 8's", {"q1", "q3"})
    tests = subsets({"q2", "q3"}, {name: ids})
    members = {subset: [q for q in ("q1", "q2", "q3", "q4") if keep(q)] for subset, keep in tests.items()}
    assert members == {"all": ["q1", "q2", "q3", "q4"], "answer shown": ["q2", "q3"],
                       "answer not shown": ["q1", "q4"], "study 8's": ["q1", "q3"], "not study 8's": ["q2", "q4"]}
    with pytest.raises(SystemExit, match="NAME=QUESTIONS"):
        read_split(str(questions))


def test_embed_adds_each_files_content_under_its_name(tmp_path):
    extra = tmp_path / "v.json"
    extra.write_bytes(orjson.dumps({"subsets": {"all": 1}}))
    out = embed({"presets": []}, [f"gain_by_visibility={extra}"])
    assert out == {"presets": [], "gain_by_visibility": {"subsets": {"all": 1}}}
    named = "greedy (T = 2): start -> end"  # a NAME may hold "=": the file is what follows the last one
    assert embed({}, [f"{named}={extra}"]) == {named: {"subsets": {"all": 1}}}
    with pytest.raises(SystemExit, match="NAME=FILE"):
        embed({}, [str(extra)])


def test_per_iteration_keeps_each_updates_kl_on_its_batch_and_held_out_in_iteration_order():
    rows = [{"iteration": 1, "train_reward": 0.5, "agent_kl_batch": 2e-3, "ranker_kl_batch": 3e-4,
             "agent_kl_heldout": 1e-4, "ranker_kl_heldout": None, "agent_loss": 0.1},
            {"iteration": -1, "dev_f1": 0.2},
            {"iteration": 0, "train_reward": 0.25, "agent_kl_batch": 1e-3}]
    assert per_iteration(rows) == [
        {"iteration": 0, "train_reward": 0.25, "agent_kl_batch": 1e-3},
        {"iteration": 1, "train_reward": 0.5, "agent_kl_batch": 2e-3, "ranker_kl_batch": 3e-4,
         "agent_kl_heldout": 1e-4}]


def test_room_reads_the_answer_flags_at_each_depth():
    flags = [False, False, False, False, True, False, True]  # answers at ranks 5 and 7
    assert room(flags, 3, 3) == {"in_top_k": False, "only_beyond_k": False, "not_first": False}
    assert room(flags, 3, 5) == {"in_top_k": False, "only_beyond_k": True, "not_first": True}
    assert room([False, True, False, True], 3, 4) == {"in_top_k": True, "only_beyond_k": False,
                                                      "not_first": True}
    assert room([True, False], 3, 5) == {"in_top_k": True, "only_beyond_k": False, "not_first": False}
    assert room([], 3, 5) == {"in_top_k": False, "only_beyond_k": False, "not_first": False}


def test_ranker_choices_count_moves_room_and_hits():
    from ranker_choices import call_figures

    calls = [
        {"candidate_has_answer": [False, True, False], "permutation": [1, 0]},  # room, taken, moved
        {"candidate_has_answer": [False, True, False], "permutation": [0, 1]},  # room, not taken
        {"candidate_has_answer": [True, False, False], "permutation": [2, 0]},  # moved off the answer
        {"candidate_has_answer": [True, True, False], "permutation": []},       # invalid: retriever's order
        {"candidate_has_answer": [False, False, False], "permutation": [2]},    # no answer: moved, unscored
    ]
    assert call_figures(calls) == {"calls": 5, "first_not_retrievers": 3, "calls_with_room": 2, "room_taken": 1,
                                   "scored_calls": 4, "hit1": 0.5, "retriever_hit1": 0.5,
                                   "departures": {"took_room": 1, "answer_for_answer": 0, "left_answer": 1,
                                                  "no_answer": 1}}
    assert call_figures([])["hit1"] is None


def test_bm25_tie_order_counts_order_and_set_differences():
    from bm25_tie_order import compare

    recorded = [["a", "b", "c"], ["d", "e"], ["f"]]
    current = [["a", "b", "c"], ["e", "d"], ["f"]]
    old = [["a", "c", "b"], ["e", "d"], ["g"]]
    assert compare(recorded, current, old) == {"calls": 3, "old_vs_current_order": 2, "old_vs_current_set": 1,
                                               "recorded_vs_current_order": 1}


def test_departures_are_compared_with_a_ranker_blind_to_the_passages_with_the_same_positions():
    from ranker_choices import departure_draws, departures_vs_chance, position_rates

    calls = [
        {"id": "q1/s0/t0", "candidate_has_answer": [False, True, False, False], "permutation": [1]},
        {"id": "q1/s1/t0", "candidate_has_answer": [True, True, False, False], "permutation": [3]},
        {"id": "q1/s2/t0", "candidate_has_answer": [True, True, False, False], "permutation": [0]},
        {"id": "q2/s0/t0", "candidate_has_answer": [False, False, False, False], "permutation": [3]},
        {"id": "q3/s5/t1", "candidate_has_answer": [False, False, True, True], "permutation": [2]},
    ]
    # 4 calls with an answer: position 1 bears one in 2, position 2 in 3, position 3 in 1, position 4 in 1
    rates = position_rates(calls)
    assert rates == {0: 0.5, 1: 0.75, 2: 0.25, 3: 0.25}
    draws = departure_draws(calls)
    assert draws == {"q1": [(1, 1), (0, 3)], "q3": [(1, 2)]}
    test = departures_vs_chance(draws, rates, samples=200)
    assert (test["departures"], test["to_answer"], test["questions"]) == (3, 2, 2)
    # chosen 2 of 3; blind with the same positions (2, 4, 3): (0.75 + 0.25 + 0.25) / 3
    assert test["rate"] == pytest.approx(2 / 3) and test["chance_rate"] == pytest.approx(1.25 / 3)
    # resampled: q1 twice 0.5 - 0.5 = 0, q3 twice 1 - 0.25 = 0.75, one each 2/3 - 1.25/3
    assert 0 - 1e-9 <= test["diff_ci"][0] <= test["diff_ci"][1] <= 0.75 + 1e-9
    assert test["by_position"] == {"2": {"departures": 1, "to_answer": 1, "position_rate": 0.75},
                                   "3": {"departures": 1, "to_answer": 1, "position_rate": 0.25},
                                   "4": {"departures": 1, "to_answer": 0, "position_rate": 0.25}}
    assert departures_vs_chance({}, rates)["rate"] is None


def test_exploration_probe_takes_each_scored_call_once():
    from ranker_exploration import unique_scored

    def call(query, ids, flags):
        return NS(query=query, candidate_ids=ids, candidate_has_answer=flags)

    pairs = [("r1", call("q", ["a", "b"], [False, True])),
             ("r2", call("q", ["a", "b"], [False, True])),   # the same sub-query and candidates again
             ("r3", call("q", ["b", "a"], [True, False])),   # other order: another call
             ("r4", call("p", ["c", "d"], [False, False])),  # nothing to score
             ("r5", call("s", ["e", "f"], [True, False]))]
    assert [r for r, _ in unique_scored(pairs, 10)] == ["r1", "r3", "r5"]
    assert [r for r, _ in unique_scored(pairs, 2)] == ["r1", "r3"]


def test_question_overlap_counts_each_file_and_each_pair_by_id(tmp_path):
    from question_overlap import overlap, question_ids

    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"id": "q1", "question": "x?", "answers": ["x"]}\n\n'
                     b'{"id": "q2", "question": "y?", "answers": ["y"]}\n')
    assert question_ids(path) == {"q1", "q2"}
    figures = overlap({"a": {"q1", "q2"}, "b": {"q2", "q3", "q4"}, "c": {"q5"}})
    assert figures == {"questions": {"a": 2, "b": 3, "c": 1},
                       "shared": {"a & b": 1, "a & c": 0, "b & c": 0}}


def test_drawn_split_keeps_the_pools_lines_in_order_and_refuses_a_foreign_pool():
    from drawn_split import split_pool

    lines = [b'{"id": "q1", "question": "a?"}', b"", b'{"id": "q2", "question": "b?"}',
             b'{"id": "q3", "question": "c?"}']
    drawn, unseen = split_pool(lines, {"q3", "q1"}, "pool.jsonl")
    assert drawn == [lines[0], lines[3]]
    assert unseen == [lines[2]]
    with pytest.raises(SystemExit, match=r"pool.jsonl: 1 questions the run drew are not in it \(e.g. q9\)"):
        split_pool(lines, {"q1", "q9"}, "pool.jsonl")


def test_drawn_ids_read_every_training_iteration_and_not_the_evaluations(tmp_path):
    from drawn_split import drawn_ids

    from cosearch_cli.artifacts import dumps
    from cosearch_cli.records import RolloutRecord

    def write(path, *qids):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"".join(dumps(RolloutRecord(q, "?", ["x"], "nq", [])) for q in qids))
    write(tmp_path / "iter-0000" / "rollouts.jsonl", "q1", "q2")
    write(tmp_path / "iter-0001" / "rollouts.jsonl", "q4")
    write(tmp_path / "eval-init" / "rollouts.jsonl", "h1")
    write(tmp_path / "iter-0001" / "eval" / "rollouts.jsonl", "h1")
    assert drawn_ids(tmp_path) == {"q1", "q2", "q4"}
    with pytest.raises(SystemExit, match="no iter-"):
        drawn_ids(tmp_path / "iter-0000")


def comparison(settings_a, settings_b):
    def side(settings, hit):
        return {"variant": {"rollout_settings": [settings]},
                "groups": [{"dataset": "average", "searches": 1.0, "hit@1": hit, "answer_in_candidates": 0.5}]}
    row = {"questions": 4, "f1_a": 0.25, "f1_b": 0.5, "f1_diff": 0.25, "f1_ci_low": 0.0, "f1_ci_high": 0.5,
           "em_a": 0.0, "em_b": 0.25, "em_diff": 0.25, "em_ci_low": 0.0, "em_ci_high": 0.75}
    return {"kind": "comparison", "a": side(settings_a, 0.5), "b": side(settings_b, 0.75),
            "differences": [{"dataset": "nq", **row}, {"dataset": "single-hop", **row}, {"dataset": "average", **row}],
            "bootstrap": {"samples": 10, "confidence": 0.95}}


def test_sampled_gains_reads_a_comparison_and_refuses_runs_decoded_differently():
    from sampled_gains import pair_figures, table

    sampled = {"greedy": False, "temperature": 0.7, "n": 2}
    f = pair_figures(comparison(sampled, sampled))
    assert f["decoding"] == "temperature 0.7, 2 samples a question"
    assert (f["questions"], f["agent_f1_before"], f["agent_f1_after"], f["agent_f1_gain_ci"]) == (4, 0.25, 0.5,
                                                                                                 [0.0, 0.5])
    assert (f["agent_em_gain"], f["ranker_hit1_before"], f["ranker_hit1_after"]) == (0.25, 0.5, 0.75)
    row = {"questions": 4, "gain": 0.25, "ci": [0.0, 0.5], "f1_before": 0.25, "f1_after": 0.5, "em_before": 0.0,
           "em_after": 0.25}
    assert f["per_dataset_f1_gain"] == {"nq": row}
    assert f["per_hop_f1_gain"] == {"single-hop": row}
    assert ("| s | 4 | temperature 0.7, 2 samples a question | 0.250 -> 0.500 | +0.250 [+0.000, +0.500] | "
            "+0.250 [+0.000, +0.750] | 95% | 0.500 -> 0.750 | 1.00 -> 1.00 |") in table({"s": f})
    with pytest.raises(SystemExit, match="decoded differently"):
        pair_figures(comparison(sampled, {"greedy": True, "temperature": 1.0, "n": 1}))
    with pytest.raises(SystemExit, match="not a comparison"):
        pair_figures({"kind": "evaluation"})


def test_greedy_agreement_counts_samples_that_answer_as_greedy_decoding_did():
    from greedy_agreement import agreement, compare, f1_parts

    def run(dataset_answers):
        return [NS(question_id=q, dataset=d, trajectories=[NS(answer=a) for a in answers])
                for q, (d, answers) in dataset_answers.items()]

    greedy = run({"q1": ("nq", ["Paris"]), "q2": ("nq", [None]), "q3": ("popqa", ["Bob"])})
    start = agreement(run({"q1": ("nq", ["the paris", "Lyon"]), "q2": ("nq", [None, "x"]),
                           "q3": ("popqa", ["Ann", "Ann"])}), greedy)
    # "the paris" normalises to "paris"; two missing answers agree
    assert start == {"q1": ("nq", 0.5), "q2": ("nq", 0.5), "q3": ("popqa", 0.0)}
    end = agreement(run({"q1": ("nq", ["Paris", "Paris."]), "q2": ("nq", [None, None]),
                         "q3": ("popqa", ["Bob", "Ann"])}), greedy)
    figures = compare(start, end, samples=200)
    # datasets averaged: start (0.5 + 0.0) / 2, end (1.0 + 0.5) / 2
    assert (figures["agreement_before"], figures["agreement_after"], figures["gain"]) == (0.25, 0.75, 0.5)
    # nq's two questions both gain 0.5 and popqa's one question 0.5: every replicate is 0.5
    assert figures["gain_ci"] == [0.5, 0.5]
    # F1 split by agreement: q1's samples "the paris" (F1 1, agrees) and "Lyon" (0); gold answers per question
    def gold(records, answers):
        for record, golds in zip(records, answers):
            record.answers = golds
        return records
    sampled = gold(run({"q1": ("nq", ["the paris", "Lyon"]), "q3": ("popqa", ["Ann", "Bob"])}), [["Paris"], ["Ann"]])
    same, other = f1_parts(sampled, greedy)
    assert same == {"q1": ("nq", 0.5), "q3": ("popqa", 0.0)}  # q3's "Bob" agrees but scores 0
    assert other == {"q1": ("nq", 0.0), "q3": ("popqa", 0.5)}  # "Ann" disagrees, F1 1, one of two samples
    assert compare(same, other, name="f1")["f1_before"] == 0.25
    with pytest.raises(SystemExit, match="no greedy rollout"):
        agreement(run({"q9": ("nq", ["x"])}), greedy)
    with pytest.raises(SystemExit, match="different questions"):
        compare(start, {"q1": ("nq", 1.0)})


def test_advantage_vs_greedy_counts_rewarded_samples_that_give_the_greedy_answer():
    from advantage_vs_greedy import greedy_answers, rewarded

    greedy = greedy_answers([NS(question_id="q1", answers=["Paris"], trajectories=[NS(answer="Paris")]),
                             NS(question_id="q2", answers=["Bob Dylan"], trajectories=[NS(answer="Bob")])])
    assert greedy == {"q1": ("paris", 1.0), "q2": ("bob", 2 / 3)}  # "bob" vs "bob dylan": P 1, R 1/2

    def traj(answer, f1, advantage, group="q/agent"):
        return NS(answer=answer, scores={"f1": f1}, advantage=advantage, group=group)
    kept, dropped = NS(id="q/agent", role="agent", kept=True), NS(id="q/agent", role="agent", kept=False)
    records = [
        NS(question_id="q1", groups=[kept], trajectories=[traj("the Paris", 1.0, 0.5), traj("Lyon", 0.0, -0.5),
                                                            traj("Paris", 1.0, 0.0)]),
        NS(question_id="q2", groups=[kept], trajectories=[traj("Bob Dylan", 1.0, 0.8), traj("Bob", 2 / 3, 0.1),
                                                            traj(None, 0.0, -0.9)]),
        NS(question_id="q3", groups=[dropped], trajectories=[traj("x", 0.0, 0.0)])]  # not trained: not counted
    figures = rewarded(records, greedy)
    assert figures["groups"] == 2 and figures["groups_with_a_sample_above_greedy_f1"] == 1  # q2's "Bob Dylan"
    assert figures["positive"] == {"samples": 3, "greedy_answer": 2, "above_greedy_f1": 1,
                                   "greedy_answer_share": 2 / 3, "above_greedy_f1_share": 1 / 3}
    assert figures["negative"] == {"samples": 2, "greedy_answer": 0, "above_greedy_f1": 0,
                                   "greedy_answer_share": 0.0, "above_greedy_f1_share": 0.0}
    with pytest.raises(SystemExit, match="no greedy rollout"):
        rewarded([NS(question_id="q9", groups=[kept], trajectories=[])], greedy)


def test_sampled_gains_reads_one_runs_evaluation_without_its_manifest():
    from sampled_gains import run_figures

    evaluation = {"kind": "evaluation", "variant": {"rollout_settings": [{"greedy": True}]},
                  "groups": [{"dataset": "single-hop", "questions": 3}, {"dataset": "average", "questions": 3,
                                                                         "f1": 0.2, "em": 0.1}],
                  "datasets": [{"dataset": "nq", "f1": 0.3}, {"dataset": "popqa", "f1": 0.1}],
                  "manifest": {"options": {"index": "/abs/indexes/x"}}}
    assert run_figures(evaluation) == {"questions": 3, "decoding": "greedy", "agent_f1": 0.2, "agent_em": 0.1,
                                       "per_dataset_f1": {"nq": 0.3, "popqa": 0.1}}
    with pytest.raises(SystemExit, match="not an evaluation"):
        run_figures({"kind": "comparison"})
