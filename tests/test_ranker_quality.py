"""Ranker quality on fixed calls: hand-computed metrics and intervals, then re-running real (tiny) rankers on
calls a real rollout recorded over the fixture's BM25 index."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
import orjson
import pytest
from conftest import run_cli
from test_evaluate import make_record
from test_evaluate_cli import one_line_error

from cosearch_cli.errors import InputError
from cosearch_cli.gains import compare_runs
from cosearch_cli.generation.base import Generation
from cosearch_cli.generation.hf import HFBackend
from cosearch_cli.ranker_quality import (fixed_calls, hit_at_1, level_ci, ndcg_at_k, paired_difference, quality,
                                         recorded_scores, rerank, retriever_scores, score_order)
from cosearch_cli.rollout import RolloutConfig, ranker_constraint_factory, run_rollouts

L3 = math.log2(3)  # the discount of the second position


def test_hit_at_1_by_hand():
    has = [False, True, False]
    assert hit_at_1(has, [1, 0]) == 1.0
    assert hit_at_1(has, [0, 1]) == 0.0
    assert hit_at_1(has, []) == 0.0


def test_ndcg_at_k_by_hand():
    has = [False, True, False, True]
    # [1, 0, 3]: relevant at positions 0 and 2 -> DCG 1 + 1/log2(4) = 1.5; the best 3 of 4 put the two
    # relevant ones first -> 1 + 1/log2(3).
    assert ndcg_at_k(has, [1, 0, 3], 3) == pytest.approx(1.5 / (1 + 1 / L3))
    # the retriever's [0, 1, 2]: only position 1 -> (1/log2(3)) / (1 + 1/log2(3))
    assert ndcg_at_k(has, [0, 1, 2], 3) == pytest.approx((1 / L3) / (1 + 1 / L3))
    assert ndcg_at_k(has, [3, 1], 2) == 1.0  # both relevant on top: perfect
    # K = 1 and three relevant candidates: the ideal is one relevant passage, so a relevant first one is 1.
    assert ndcg_at_k([True, True, True], [2], 1) == 1.0
    assert ndcg_at_k([False, False], [0, 1], 2) == 0.0


def hand_records():
    """q1 (nq): two counted calls; q2 (nq): one call without an answer-bearing candidate; q3 (hotpotqa): one
    counted call; q4 (nq): a call without candidates. Each call: (candidate_has_answer, permutation, valid)."""
    return [
        make_record("q1", "nq", ["x"], [("x", 2, True)], [([False, True, False], [1, 0], True),
                                                         ([True, False, False], [1, 0], True)], ranker="llm",
                    sampling={"k": 2}),
        make_record("q2", "nq", ["x"], [("y", 1, True)], [([False, False, False], [2, 1], False)], ranker="llm",
                    sampling={"k": 2}),
        make_record("q3", "hotpotqa", ["x"], [("x", 1, True)], [([False, False, True], [2, 0], True)],
                    ranker="llm", sampling={"k": 2}),
        make_record("q4", "nq", ["x"], [(None, 1, False)], [([], [], False)], ranker="llm", sampling={"k": 2}),
    ]


def test_fixed_calls_skip_calls_without_candidates_and_keep_the_runs_k():
    calls = fixed_calls(hand_records())
    assert [call.id for _, call in calls.pairs] == ["q1/s0/t0", "q1/s0/t1", "q2/s0/t0", "q3/s0/t0"]
    assert calls.skipped_no_candidates == 1 and calls.k == 2 and calls.questions() == 3
    assert calls.config.greedy and calls.config.ranker == "llm"


def test_fixed_calls_refuse_mixed_settings_and_no_calls():
    records = hand_records()
    records[2].sampling = {"k": 3}
    with pytest.raises(InputError, match="different 'k'"):
        fixed_calls(records)
    with pytest.raises(InputError, match="no ranker call with candidates"):
        fixed_calls(hand_records()[3:])


def test_quality_and_paired_difference_by_hand():
    calls = fixed_calls(hand_records())
    retriever, ranker = retriever_scores(calls), recorded_scores(calls)
    # Retriever top-2 [0, 1]: q1/t0 Hit 0, nDCG 1/log2(3); q1/t1 Hit 1, nDCG 1; q2 not counted; q3 Hit 0, nDCG 0.
    # Ranker: q1/t0 [1, 0] Hit 1, nDCG 1; q1/t1 [1, 0] Hit 0, nDCG 1/log2(3); q2 invalid, not counted;
    # q3 [2, 0] Hit 1, nDCG 1.
    assert [s.hit1 for s in retriever] == [0.0, 1.0, None, 0.0]
    assert [s.hit1 for s in ranker] == [1.0, 0.0, None, 1.0]
    r, q = quality(retriever), quality(ranker)
    rows = {row["dataset"]: row for row in q["datasets"] + q["groups"]}
    assert rows["nq"]["calls"] == 3 and rows["nq"]["calls_with_answer"] == 2 and rows["nq"]["invalid"] == 1
    assert rows["nq"]["hit1"] == 0.5 and rows["hotpotqa"]["hit1"] == 1.0
    assert q["hit1"] == 0.75 and r["hit1"] == 0.25  # unweighted over nq and hotpotqa
    assert q["ndcg"] == pytest.approx(((1 + 1 / L3) / 2 + 1) / 2)
    assert r["ndcg"] == pytest.approx(((1 / L3 + 1) / 2 + 0) / 2)
    assert (q["calls"], q["calls_with_answer"], q["invalid"]) == (4, 3, 1)
    assert rows["nq"]["questions_with_answer"] == 1 and q["thin_datasets"] == ["nq", "hotpotqa"]
    # B - A = ranker - retriever. nq's only counted question q1 has call differences +1 and -1 (mean 0, two
    # calls), hotpotqa's q3 +1: one counted question per dataset, so every replicate equals the point.
    diff = paired_difference(retriever, ranker, "hit1", samples=200, seed=0)
    assert (diff["nq"]["diff"], diff["nq"]["ci_low"], diff["nq"]["ci_high"]) == (0.0, 0.0, 0.0)
    assert (diff["average"]["diff"], diff["average"]["ci_low"], diff["average"]["ci_high"]) == (0.5, 0.5, 0.5)
    assert paired_difference(ranker, ranker, "ndcg", samples=50)["average"]["ci_high"] == 0.0


def test_paired_difference_resamples_questions_not_calls():
    # nq: q1 gains on its one counted call (+1); q2 changes nothing on its three calls. Pooled over calls the
    # gain is 1/4; a replicate draws two questions: both q1 (1/4 of the time) -> 1, both q2 -> 0, one each
    # -> 1/4 (calls pooled). So the interval is [0, 1] and 3/4 of the replicates are positive.
    has = [True, False]
    records = [make_record("q1", "nq", ["a"], [("a", 1, True)], [(has, [0, 1], True)], sampling={"k": 2}),
               make_record("q2", "nq", ["a"], [("a", 1, True)], [(has, [0, 1], True)] * 3, sampling={"k": 2})]
    calls = fixed_calls(records)
    after = retriever_scores(calls)  # Hit@1 = 1 on every call
    before = [score_order(record, call, [1, 0] if record.question_id == "q1" else [0, 1], 2)
              for record, call in calls.pairs]
    diff = paired_difference(before, after, "hit1", samples=4000, seed=0)["nq"]
    assert diff["diff"] == 0.25 and (diff["ci_low"], diff["ci_high"]) == (0.0, 1.0)
    assert diff["share_positive"] == pytest.approx(0.75, abs=0.03)


def test_level_ci_resamples_questions_within_datasets_by_hand():
    # One counted question per dataset (hand_records): every replicate redraws it, so the interval is the point.
    ranker = recorded_scores(fixed_calls(hand_records()))
    assert level_ci(ranker) == [0.75, 0.75] and level_ci(ranker, "ndcg") == [pytest.approx(quality(ranker)["ndcg"])] * 2
    # nq: q1 Hit@1 1 on its one call, q2 0 on its three calls (pooled 1/4). A replicate draws two questions:
    # both q1 (1/4 of the time) -> 1, both q2 (1/4) -> 0, one each -> 1/4; the 2.5% and 97.5% points: 0 and 1.
    has = [True, False]
    records = [make_record("q1", "nq", ["a"], [("a", 1, True)], [(has, [0, 1], True)], sampling={"k": 2}),
               make_record("q2", "nq", ["a"], [("a", 1, True)], [(has, [0, 1], True)] * 3, sampling={"k": 2})]
    calls = fixed_calls(records)
    scores = [score_order(record, call, [0, 1] if record.question_id == "q1" else [1, 0], 2)
              for record, call in calls.pairs]
    assert quality(scores)["hit1"] == 0.25 and level_ci(scores, samples=4000) == [0.0, 1.0]
    assert level_ci(scores, samples=4000, confidence=0.4) == [0.25, 0.25]  # the middle 40%: mixed draws (1/2)
    no_answer = [replace(s, hit1=None, ndcg=None) for s in scores]
    assert level_ci(no_answer) is None


def test_paired_difference_refuses_other_calls():
    calls = fixed_calls(hand_records())
    with pytest.raises(InputError, match="different calls"):
        paired_difference(retriever_scores(calls), retriever_scores(calls)[:2], "hit1")


# --- real rankers on calls a real rollout recorded over the fixture's BM25 index ------------------------------


class SearchTheQuestion:
    """An agent that searches the question's own text once, then answers "x" (no model: the ranker is tested)."""

    name = "scripted"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def generate(self, requests, settings):
        out = []
        for request in requests:
            prompt = self.tokenizer.decode(request.prompt_ids)
            if "<information>" in prompt.split("<|im_start|>assistant")[-1]:
                text = "<think>ok</think><answer> x </answer>"
            else:
                text = f"<think>look</think><search> {prompt.split('Question: ')[1].split('<|im_end|>')[0]} </search>"
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            out.append(Generation(ids, text, [-0.5] * len(ids)))
        return out


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("idx") / "fixture"
    result = run_cli("index", "fixture", "--out", folder, "--no-dense", "--quiet")
    assert result.exit_code == 0, result.stderr
    return folder


@pytest.fixture(scope="module")
def bm25_index(index_dir):
    from cosearch_cli.index import open_index

    return open_index(index_dir)


@pytest.fixture(scope="module")
def dev_questions(fixtures_dir):
    from cosearch_cli.records import read_questions

    questions, _ = read_questions(fixtures_dir / "dev.jsonl")
    by_dataset = {}
    for q in questions:
        by_dataset.setdefault(q.dataset, q)
    return list(by_dataset.values())  # one per dataset


@pytest.fixture(scope="module")
def recorded(tiny_lm, bm25_index, dev_questions):
    """A greedy evaluation rollout: the tiny Llama ranks under the rollout's constraint."""
    model, tokenizer = tiny_lm
    ranker = HFBackend(model, tokenizer)
    config = RolloutConfig(n=1, greedy=True, max_turns=1, top_n=5, k=3, ranker="llm", ranker_max_new_tokens=40,
                           ranker_constraint=ranker_constraint_factory(ranker))
    return list(run_rollouts(dev_questions, agent=SearchTheQuestion(tokenizer), ranker_backend=ranker,
                             index=bm25_index, config=config))


def test_rerunning_the_rollouts_own_ranker_reproduces_its_choices(tiny_lm, bm25_index, recorded, one_torch_thread):
    model, tokenizer = tiny_lm
    calls = fixed_calls(recorded)
    assert len(calls.pairs) == len(recorded) and calls.k == 3 and calls.skipped_no_candidates == 0
    assert calls.config.ranker_max_new_tokens == 40
    scores = rerank(calls, HFBackend(model, tokenizer), bm25_index.docs, constrained=True, batch=3)
    assert [s.permutation for s in scores] == [call.permutation for _, call in calls.pairs]
    assert all(s.valid for s in scores)
    assert scores == recorded_scores(calls)
    counted = [s for s in scores if s.hit1 is not None]
    assert counted, "BM25 on the questions' own text finds some answer-bearing passages"
    for s, (_, call) in zip(scores, calls.pairs):
        assert s.hit1 == (call.candidate_has_answer[s.permutation[0]] if any(call.candidate_has_answer) else None)


def test_invalid_outputs_count_as_the_retrievers_top_k(tiny_lm, bm25_index, recorded, one_torch_thread):
    model, tokenizer = tiny_lm
    calls = fixed_calls(recorded)
    # Unconstrained, the random model writes no ranking: every call falls back to the first K candidates.
    scores = rerank(calls, HFBackend(model, tokenizer), bm25_index.docs, constrained=False)
    assert not any(s.valid for s in scores) and all(s.error for s in scores)
    retriever = retriever_scores(calls)
    assert [s.permutation for s in scores] == [s.permutation for s in retriever] == [[0, 1, 2]] * len(recorded)
    assert quality(scores)["hit1"] == quality(retriever)["hit1"] and quality(scores)["invalid"] == len(recorded)


def test_a_ranker_judged_on_another_index_is_refused(tiny_lm, recorded):
    model, tokenizer = tiny_lm
    calls = fixed_calls(recorded)

    class Shuffled:
        def get(self, ids):
            from cosearch_cli.records import Passage
            return [Passage(pid, "t", "nothing here") for pid in ids]

    assert any(any(call.candidate_has_answer) for _, call in calls.pairs)
    with pytest.raises(InputError, match="does not match what the rollout recorded"):
        rerank(calls, HFBackend(model, tokenizer), Shuffled(), constrained=False)


# --- the command ---------------------------------------------------------------------------------------------


def write_records(path, records):
    path.write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in records))
    return path


def test_evaluate_ranker_command(tmp_path, index_dir, tiny_dir, recorded, one_torch_thread):
    calls_file = write_records(tmp_path / "eval.jsonl", recorded)
    result = run_cli("evaluate", "ranker", "--calls", calls_file, "--index", index_dir, "--ranker-model", tiny_dir,
                     "--baseline-model", tiny_dir, "--per-call", tmp_path / "calls.parquet", "--bootstrap", "100")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    n = len(recorded)
    assert summary["kind"] == "ranker_quality" and summary["calls"] == n and summary["k"] == 3
    assert summary["skipped_no_candidates"] == 0 and summary["questions"] == n
    orders = summary["orders"]
    assert set(orders) == {"ranker", "baseline", "retriever"}
    # `--constrain recorded`: the run was made with the ranker constrained, so the re-run is too, and the same
    # model gives back the recorded choices.
    assert orders["ranker"]["hit1"] == quality(recorded_scores(fixed_calls(recorded)))["hit1"]
    assert orders["ranker"]["invalid"] == 0
    same = summary["differences"]["ranker_vs_baseline"]["hit1"]["average"]
    assert (same["diff"], same["ci_low"], same["ci_high"]) == (0.0, 0.0, 0.0)
    assert set(summary["differences"]) == {"ranker_vs_retriever", "ranker_vs_baseline", "baseline_vs_retriever"}
    assert summary["manifest"]["stage"] == "evaluate-ranker" and summary["manifest"]["upstream"][-1]["stage"] == "index"
    assert "Ranker quality" in result.stderr and "Paired differences" in result.stderr
    # one question per dataset: every dataset with a scored call is named as too thin for its own spread
    thin = orders["retriever"]["thin_datasets"]
    assert thin and "one scored question each" in " ".join(result.stderr.split()) and thin[0] in result.stderr
    import polars as pl

    rows = pl.read_parquet(tmp_path / "calls.parquet")
    assert rows.height == 3 * n and sorted(set(rows["order"])) == ["baseline", "ranker", "retriever"]
    # the same calls read through a shorter window: recorded, and the retriever's order is scored as before
    short = run_cli("evaluate", "ranker", "--calls", calls_file, "--index", index_dir, "--ranker-model", tiny_dir,
                    "--ranker-passage-tokens", "4", "--bootstrap", "100", "--quiet")
    assert short.exit_code == 0, short.stderr
    cut = json.loads(short.stdout)
    assert cut["manifest"]["options"]["ranker_passage_tokens"] == 4
    assert summary["manifest"]["options"]["ranker_passage_tokens"] == fixed_calls(recorded).config.ranker_passage_tokens
    assert cut["orders"]["retriever"] == orders["retriever"] and cut["calls"] == n


def test_evaluate_ranker_errors(tmp_path, index_dir, tiny_dir, recorded):
    calls_file = write_records(tmp_path / "eval.jsonl", recorded)
    one_line_error(run_cli("evaluate", "ranker", "--calls", calls_file, "--index", tmp_path / "nowhere",
                           "--ranker-model", tiny_dir), 6, "no index folder")
    questions = tmp_path / "questions.jsonl"
    questions.write_text('{"id": "a", "question": "?", "answers": ["x"]}\n')
    one_line_error(run_cli("evaluate", "ranker", "--calls", questions, "--index", index_dir, "--ranker-model",
                           tiny_dir), 3, "questions.jsonl:1:", "expected a rollout record")
    one_line_error(run_cli("evaluate", "ranker", "--calls", calls_file, "--index", index_dir, "--ranker-model",
                           tiny_dir, "--bootstrap", "0"), 4, "--bootstrap")
    one_line_error(run_cli("evaluate", "ranker", "--calls", calls_file, "--index", index_dir, "--ranker-model",
                           tiny_dir, "--ranker-passage-tokens", "0"), 4, "--ranker-passage-tokens")


# --- before vs after ---------------------------------------------------------------------------------------


def test_compare_runs_by_hand():
    before = hand_records()
    after = hand_records()
    after[1].trajectories[0].answer = "x"  # q2 (nq) now right
    calls = fixed_calls(before)
    report = compare_runs(before, after, calls=calls, ranker_before=None, ranker_after=recorded_scores(calls),
                          samples=4000, seed=0)
    # Agent F1: nq = mean(q1 1, q2 0, q4 0) = 1/3 -> 2/3; hotpotqa (q3) 1; average over the two datasets.
    assert report["questions"] == 4
    assert report["agent_f1_before"] == pytest.approx(2 / 3) and report["agent_f1_after"] == pytest.approx(5 / 6)
    assert report["agent_f1_gain"] == pytest.approx(1 / 6) and report["agent_em_gain"] == pytest.approx(1 / 6)
    # nq's differences are (0, 1, 0): a replicate's nq mean is 0 with p 8/27 and 1 with p 1/27 (> 2.5%), and
    # the average is half of it (hotpotqa adds 0), so the interval is [0, 1/2].
    assert report["agent_f1_gain_ci"] == pytest.approx([0.0, 0.5])
    # Ranker: before = no model (the retriever's order), after = the recorded choices (test above by hand).
    assert report["ranker_hit1_before"] == report["retriever_hit1"] == 0.25 and report["ranker_hit1_after"] == 0.75
    assert report["ranker_hit1_gain"] == 0.5 and report["ranker_hit1_gain_ci"] == [0.5, 0.5]
    assert report["ranker_vs_retriever"] == 0.5 and report["ranker_vs_retriever_ci"] == [0.5, 0.5]
    assert report["ranker_before_vs_retriever_ci"] == [0.0, 0.0]
    assert report["ranker_ndcg_after"] == pytest.approx(((1 + 1 / L3) / 2 + 1) / 2)
    assert report["ranker_counts"] == {"questions": 3, "calls": 4, "calls_with_answer": 3, "skipped_no_candidates": 1,
                                       "k": 2, "invalid_before": 0, "invalid_after": 1,
                                       "thin_datasets": ["nq", "hotpotqa"]}
    no_ranker = compare_runs(before, after, samples=100)
    assert no_ranker["ranker_hit1_after"] is None and no_ranker["ranker_vs_retriever_ci"] is None
    assert no_ranker["agent_f1_gain"] == report["agent_f1_gain"]


def test_evaluate_compare_command(tmp_path, index_dir, tiny_dir, recorded, one_torch_thread):
    before = write_records(tmp_path / "before.jsonl", recorded)
    better = [replace(r, trajectories=[replace(t, answer=r.answers[0]) for t in r.trajectories]) for r in recorded]
    after = write_records(tmp_path / "after.jsonl", better)
    agent_only = run_cli("evaluate", "compare", before, after, "--bootstrap", "200")
    assert agent_only.exit_code == 0, agent_only.stderr
    report = json.loads(agent_only.stdout)
    assert report["kind"] == "learning_gain" and report["agent_f1_after"] == 1.0
    assert report["agent_f1_gain_ci"][0] > 0 and report["ranker_hit1_before"] is None
    assert "Before vs after" in agent_only.stderr

    result = run_cli("evaluate", "compare", before, after, "--index", index_dir, "--ranker-before", tiny_dir,
                     "--ranker-after", tiny_dir, "--bootstrap", "200", "-o", tmp_path / "gain.json", "--quiet")
    assert result.exit_code == 0, result.stderr
    report = json.loads((tmp_path / "gain.json").read_text())
    # the same model on the same calls: no gain, and exactly the recorded choices (the run was constrained)
    assert report["ranker_hit1_before"] == report["ranker_hit1_after"]
    assert report["ranker_hit1_gain_ci"] == [0.0, 0.0]
    assert report["ranker_hit1_after"] == quality(recorded_scores(fixed_calls(recorded)))["hit1"]
    assert report["ranker_counts"]["calls"] == len(recorded) and report["ranker_counts"]["invalid_after"] == 0
    assert report["manifest"]["stage"] == "evaluate-compare"
    one_line_error(run_cli("evaluate", "compare", before, after, "--ranker-after", tiny_dir), 4, "need --index")
    one_line_error(run_cli("evaluate", "compare", before, tmp_path / "none.jsonl"), 3, "file not found")


def test_passage_check_uses_the_containment_the_rollout_recorded(fixture_bm25):
    from cosearch_cli.ranker_quality import check_passages

    # musique-003220's title "Protestantism" holds the answer; its text does not
    def calls(sampling, flag):
        record = make_record("q1", "musique", ["Protestantism"], [("x", 1, True)], [([flag], [0], True)],
                             ranker="llm", sampling=sampling)
        record.ranker_calls[0].candidate_ids = ["musique-003220"]
        return fixed_calls([record])

    passages = dict(zip(["musique-003220"], fixture_bm25.docs.get(["musique-003220"])))
    check_passages(calls({"k": 1, "answer_containment": "text"}, False), passages)
    check_passages(calls({"k": 1}, True), passages)  # written before the text-only rule: title + text
    with pytest.raises(InputError, match="does not match what the rollout recorded"):
        check_passages(calls({"k": 1, "answer_containment": "text"}, True), passages)
