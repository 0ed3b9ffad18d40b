"""Ranker calls with no candidates (a sub-query BM25 matches nothing, e.g. "and"): set aside before clustering,
never rewarded or penalised, never trained on, and counted apart from invalid outputs in every summary.

Reproduced with the real BM25 index over the fixture corpus and the real stages after rollout.
"""

from __future__ import annotations

import orjson
import pytest
from conftest import run_cli
from test_rollout import Scripted

from cosearch_cli.advantages import assign_advantages
from cosearch_cli.evaluate import evaluate
from cosearch_cli.generation.base import Generation
from cosearch_cli.generation.hf import derive_seed
from cosearch_cli.grouping import GroupConfig, describe_groups, group_record
from cosearch_cli.models import load_tokenizer
from cosearch_cli.records import Question
from cosearch_cli.rewards import RewardConfig, score_record
from cosearch_cli.rollout import RolloutConfig, RolloutStats, run_rollouts
from cosearch_cli.update.batch import training_sequences


@pytest.fixture(scope="module")
def bm25_index(fixture_bm25):
    return fixture_bm25


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2")


class BySample:
    """An agent whose reply depends on the trajectory's sample and turn (read back from the row's seed)."""

    name = "by-sample"

    def __init__(self, tokenizer, reply):
        self.tokenizer, self.reply = tokenizer, reply
        self.rows = {derive_seed(0, "q0", s, t, "agent"): (s, t) for s in range(8) for t in range(3)}

    def generate(self, requests, settings):
        out = []
        for request in requests:
            ids = self.tokenizer.encode(self.reply(*self.rows[request.seed]), add_special_tokens=False)
            out.append(Generation(ids, self.tokenizer.decode(ids), [-0.5] * len(ids)))
        return out


QUERIES = ["and", "and", "and", "and", "capital of France", "capital of France", "capital of France",
           "capital of France"]
ANSWERS = ["Paris", "Lyon", "Paris", "Lyon", "Paris", "Lyon", "Paris France", "Paris"]


def replies(sample, turn):
    if turn == 0:
        return f"<think>look</think><search> {QUERIES[sample]} </search>"
    return f"<think>done</think><answer> {ANSWERS[sample]} </answer>"


def rolled(tokenizer, index, stats=None):
    agent = BySample(tokenizer, replies)
    ranker = Scripted(tokenizer, lambda prompt: "<reason>r</reason><ranking>[2] > [1]</ranking>")
    config = RolloutConfig(n=8, top_n=4, k=2, max_turns=1, question_chunk=1)
    question = Question("q0", "What is the capital of France?", ["Paris"], dataset="nq")
    return list(run_rollouts([question], agent=agent, ranker_backend=ranker, index=index, config=config,
                             stats=stats))


def test_bm25_matches_nothing_for_a_stopword_query(bm25_index):
    assert bm25_index.retriever(None).search(["and"], 4) == [[]]


def test_empty_calls_are_set_aside_never_rewarded_and_never_trained(tokenizer, bm25_index):
    stats = RolloutStats()
    (record,) = rolled(tokenizer, bm25_index, stats)
    empty = [c for c in record.ranker_calls if not c.candidate_ids]
    assert [c.sample for c in empty] == [0, 1, 2, 3]
    assert stats.ranker_calls == 8 and stats.ranker_no_candidates == 4 and stats.ranker_invalid == 0

    group_record(record, GroupConfig(kmin=3))
    groups = {g.id: g for g in record.groups}
    aside = groups["q0/ranker/excluded/no-candidates"]
    assert aside.members == [c.id for c in empty] and not aside.kept and aside.reason == "no-candidates"
    # the four real calls cluster alone; nothing of the empty ones is in a trainable group
    clustered = [g for g in record.groups if g.role == "ranker" and "excluded" not in g.id]
    assert [sorted(g.members) for g in clustered] == [[f"q0/s{s}/t0" for s in range(4, 8)]]
    assert "ranker calls left out before clustering: 4 no-candidates" in describe_groups([("q0", record.groups)])

    score_record(record, RewardConfig())
    assert all(c.reward is None and c.reward_parts == {} for c in empty)
    assign_advantages([record])
    assert all(c.advantage == 0.0 for c in empty)
    # none of the real calls' BM25 candidates holds "Paris" (all hard): reward = r_main = answer F1,
    # Paris 1, Lyon 0, "Paris France" 2/3, Paris 1; mean 2/3, so s6's advantage is exactly 0
    real = [c for c in record.ranker_calls if c.candidate_ids]
    assert not any(c.any_has_answer for c in real)
    assert [c.reward for c in real] == pytest.approx([1.0, 0.0, 2 / 3, 1.0])
    # before the fix: RecordError "ranker call q0/s0/t0 has no prompt_ids"
    seqs = training_sequences([record], "ranker")
    assert sorted(s.key for s in seqs) == ["q0/s4/t0", "q0/s5/t0", "q0/s7/t0"]


def test_evaluation_counts_empty_calls_apart_from_invalid_outputs(tokenizer, bm25_index):
    records = rolled(tokenizer, bm25_index)
    row = evaluate(records).datasets[0]
    # 8 calls, 4 retrieved nothing, none of the 4 ranked outputs is invalid
    assert row["ranker_calls"] == 8 and row["no_candidates"] == 0.5 and row["invalid"] == 0.0


def test_every_summary_counts_empty_calls_apart(tmp_path, tokenizer, bm25_index):
    from cosearch_cli.cli.rollout import summary
    from cosearch_cli.oracle import datasets_markdown
    from cosearch_cli.train import _train_row

    stats = RolloutStats()
    records = rolled(tokenizer, bm25_index, stats)
    assert "ranker calls 8 (4 with no candidates), 0/4 invalid;" in summary(stats)

    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    grouped = run_cli("group", str(path), "--kmin", "3")
    scored = run_cli("reward", "-", input=grouped.stdout)
    assert scored.exit_code == 0, scored.stderr
    assert "ranker: 8 calls (4 with no candidates, not scored), 4 scored (0 invalid outputs)" in scored.stderr
    assert "ranker calls left out before clustering: 4 no-candidates" in scored.stderr

    table = datasets_markdown({"llm": evaluate(records)})
    header, _, row = table.splitlines()
    cells = dict(zip(header.split(" | "), row.split(" | ")))
    assert cells["no cands"] == "0.500" and cells["invalid"] == "0.000"

    metrics = _train_row(records, records)
    assert metrics["ranker_calls"] == 8 and metrics["ranker_no_candidates"] == 4 and metrics["ranker_valid"] == 1.0


def test_a_grouped_file_that_trains_an_empty_call_is_refused(tokenizer, bm25_index):
    from cosearch_cli.errors import RecordError
    from cosearch_cli.grouping import check_grouped

    (record,) = rolled(tokenizer, bm25_index)
    group_record(record, GroupConfig(kmin=3))
    # as grouping did before empty calls were set aside: into the hard split, clustered by sub-query
    aside = next(g for g in record.groups if g.reason == "no-candidates")
    aside.id, aside.kept, aside.reason = "q0/ranker/hard/c1", True, ""
    for call in record.ranker_calls:
        if call.no_candidates:
            call.group = aside.id
    with pytest.raises(RecordError, match=r"ranker call 'q0/s0/t0' retrieved no candidates but is grouped for "
                                          r"training .*regroup with `cosearch group`"):
        check_grouped(record, "grouped.jsonl", 1)
