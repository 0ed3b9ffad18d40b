"""bench/pool_runs.py: two models' greedy rollouts of the same questions become one file that evaluate scores as
their per-question mean (issue 14, study 14)."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import orjson
import pytest

from conftest import ROOT
from cosearch_cli.evaluate import evaluate
from cosearch_cli.records import RolloutRecord, Trajectory
from cosearch_cli.train import read_records

sys.path.insert(0, str(ROOT / "bench"))
import pool_runs  # noqa: E402


def greedy(qid: str, answers: list[str], answer: str | None) -> dict:
    trajectory = Trajectory(sample=0, turns=[], answer=answer, n_searches=1, format_ok=answer is not None,
                            token_ids=[], loss_mask=[], logprobs=[], prompt_len=0)
    return asdict(RolloutRecord(question_id=qid, question=f"question {qid}", answers=answers, dataset="nq",
                                trajectories=[trajectory], ranker_calls=[], sampling={}))


def write(path: Path, records: list[dict]) -> str:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def test_pooled_file_scores_each_question_as_the_mean_of_the_models(tmp_path):
    a = write(tmp_path / "a.jsonl", [greedy("q1", ["Paris"], "Paris"), greedy("q2", ["Bob Dylan"], "Dylan")])
    # b in another question order: pooling follows a's order and matches by id.
    b = write(tmp_path / "b.jsonl", [greedy("q2", ["Bob Dylan"], "Bob Dylan"), greedy("q1", ["Paris"], "Lyon")])
    out = tmp_path / "pooled.jsonl"
    pool_runs.main([a, b, "-o", str(out)])
    records = read_records(out)
    assert [r.question_id for r in records] == ["q1", "q2"]
    assert [[t.answer for t in r.trajectories] for r in records] == [["Paris", "Lyon"], ["Dylan", "Bob Dylan"]]
    assert [[t.sample for t in r.trajectories] for r in records] == [[0, 1], [0, 1]]
    scores = {s.question_id: s.f1 for s in evaluate(records).questions}
    # q1: F1 1 (a) and 0 (b) -> 0.5. q2: "Dylan" vs "Bob Dylan": P 1, R 1/2 -> F1 2/3 (a); 1 (b) -> 5/6.
    assert scores == {"q1": pytest.approx(0.5), "q2": pytest.approx(5 / 6)}
    manifest = orjson.loads((tmp_path / "pooled.manifest.json").read_bytes())
    assert manifest["stage"] == "pool_runs" and set(manifest["inputs"]) == {a, b}


def test_pooling_refuses_different_questions_or_sampled_rollouts(tmp_path):
    a = write(tmp_path / "a.jsonl", [greedy("q1", ["Paris"], "Paris"), greedy("q2", ["Bob Dylan"], "Dylan")])
    b = write(tmp_path / "b.jsonl", [greedy("q1", ["Paris"], "Paris")])
    with pytest.raises(SystemExit, match="'q2' is in one input but not in"):
        pool_runs.main([a, b, "-o", str(tmp_path / "x.jsonl")])
    sampled = greedy("q1", ["Paris"], "Paris")
    sampled["trajectories"] = sampled["trajectories"] * 2
    c = write(tmp_path / "c.jsonl", [sampled, greedy("q2", ["Bob Dylan"], "Dylan")])
    with pytest.raises(SystemExit, match="has 2 trajectories; pool greedy rollouts"):
        pool_runs.main([c, a, "-o", str(tmp_path / "y.jsonl")])
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "y.jsonl").exists()


def test_a_malformed_line_or_record_stops_pooling_naming_file_and_line(tmp_path):
    good = write(tmp_path / "good.jsonl", [greedy("q1", ["Paris"], "Paris"), greedy("q2", ["Bob Dylan"], "Dylan")])
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(orjson.dumps(greedy("q1", ["Paris"], "Paris")) + b"\n{\"question_id\": \"q2\",\n")
    with pytest.raises(SystemExit, match=r"broken\.jsonl:2: not valid JSON"):
        pool_runs.main([good, str(broken), "-o", str(tmp_path / "x.jsonl")])
    no_trajectories = greedy("q2", ["Bob Dylan"], "Dylan")
    del no_trajectories["trajectories"]
    lacking = write(tmp_path / "lacking.jsonl", [greedy("q1", ["Paris"], "Paris"), no_trajectories])
    with pytest.raises(SystemExit, match=r"lacking\.jsonl:2: .*trajectories"):
        pool_runs.main([good, lacking, "-o", str(tmp_path / "y.jsonl")])
    assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "y.jsonl").exists()
