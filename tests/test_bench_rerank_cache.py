"""bench/learning_evidence.py keeps a checkpoint's re-ranking of the held-out calls on disk and reuses it only
when nothing it depends on changed (issue 14: ~7 min a ranker per study at 630 questions)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import cosearch_cli.ranker_quality as ranker_quality
from conftest import ROOT, TextDocs as Docs
from cosearch_cli.ranker_quality import CallScore

sys.path.insert(0, str(ROOT / "bench"))
import learning_evidence as evidence  # noqa: E402


def setup(tmp_path: Path, monkeypatch):
    calls_made = []

    def fake_rerank(calls, backend, docs, *, constrained, on_progress=None):
        calls_made.append(backend)
        on_progress(len(calls.pairs))
        return [CallScore(call_id=c.id, question_id=r.question_id, dataset=r.dataset, k=2, permutation=[1, 0],
                          valid=True, answer_candidates=1, hit1=1.0, ndcg=1.0) for r, c in calls.pairs]

    monkeypatch.setattr(ranker_quality, "rerank", fake_rerank)
    record = SimpleNamespace(question_id="q1", question="who?", answers=["Ann"], dataset="nq")
    call = SimpleNamespace(id="q1/s0/t0", candidate_ids=["p1", "p2"], candidate_has_answer=[False, True])
    calls = SimpleNamespace(pairs=[(record, call)], config=SimpleNamespace(k=2, ranker_passage_tokens=32))
    docs = Docs({"p1": "one", "p2": "two Ann"})
    runner = SimpleNamespace(index=SimpleNamespace(docs=docs), backend=lambda model: f"backend of {model}")
    evidence._RERANKED.clear()
    model = tmp_path / "ranker"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights v1")
    (model / "config.json").write_text("{}")
    (model / "optimizer.pt").write_bytes(b"adam state")
    return calls_made, calls, docs, runner, model


def test_a_second_study_reuses_the_stored_reranking(tmp_path, monkeypatch, capsys):
    calls_made, calls, docs, runner, model = setup(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    first = evidence.reranked(runner, calls, str(model), True, cache)
    assert len(calls_made) == 1 and len(list(cache.glob("*.json"))) == 1
    # The re-ranking reports its progress (calls done of all) on stderr, as every long step does.
    assert f"re-ranking with {model}: 1/1 calls (100%), done" in capsys.readouterr().err
    evidence._RERANKED.clear()  # a new process: only the disk cache is left
    (model / "optimizer.pt").write_bytes(b"other adam state")  # not part of what the ranker writes
    again = evidence.reranked(runner, calls, str(model), True, cache)
    assert len(calls_made) == 1
    assert again == first and again[0].permutation == [1, 0] and again[0].hit1 == 1.0


def test_changed_weights_passages_or_constraint_are_reranked(tmp_path, monkeypatch):
    calls_made, calls, docs, runner, model = setup(tmp_path, monkeypatch)
    cache = tmp_path / "cache"
    key = evidence.rerank_key(calls, docs, str(model), True)
    assert evidence.rerank_key(calls, docs, str(model), False) != key
    docs.texts["p2"] = "two Bob"
    assert evidence.rerank_key(calls, docs, str(model), True) != key
    docs.texts["p2"] = "two Ann"
    assert evidence.rerank_key(calls, docs, str(model), True) == key
    evidence.reranked(runner, calls, str(model), True, cache)
    evidence._RERANKED.clear()
    (model / "model.safetensors").write_bytes(b"weights v2")
    evidence.reranked(runner, calls, str(model), True, cache)
    assert len(calls_made) == 2 and len(list(cache.glob("*.json"))) == 2
    # A model that is no folder (a registry name) is never stored.
    assert evidence.rerank_key(calls, docs, "smollm2", True) is None
