"""Sharded BM25 (bm25_sharded.py): the same rankings and scores as bm25s, whatever the shard size; identical
rebuilds; the CLI's backend option and its errors."""

import math
import re

import orjson
import pytest

from conftest import run_cli
from cosearch_cli.index import Corpus, build_index, open_index
from cosearch_cli.index import bm25_sharded
from cosearch_cli.index.bm25_sharded import ShardedBM25Retriever
from cosearch_cli.records import Passage
from test_index import folder_digest, word_passages, write_corpus


@pytest.fixture(scope="module")
def fixture_questions(fixtures_dir):
    return [orjson.loads(line)["question"] for name in ("dev.jsonl", "train.jsonl")
            for line in (fixtures_dir / name).read_bytes().splitlines() if line]


@pytest.fixture(scope="module")
def fixture_indexes(tmp_path_factory, fixtures_dir):
    """The fixture corpus three ways: bm25s, sharded into 300-passage shards (5 of them), and one shard."""
    root = tmp_path_factory.mktemp("sharded")
    corpus = str(fixtures_dir / "corpus.jsonl")
    build_index(Corpus(corpus), root / "bm25s")
    build_index(Corpus(corpus), root / "shards", bm25_backend="sharded", shard_size=300)
    build_index(Corpus(corpus), root / "one", bm25_backend="sharded", shard_size=10_000)
    return {name: open_index(root / name) for name in ("bm25s", "shards", "one")}


def assert_same_ranking(expected, got, deeper):
    """Same scores rank by rank (1e-4 relative) and the same ids, where passages with equal scores may come
    in either order; a tie cut by k may keep any of its members (`deeper`: the expected list, longer)."""
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.score == pytest.approx(e.score, rel=1e-4)
    start = 0
    while start < len(expected):
        stop = start
        while stop < len(expected) and expected[stop].score == expected[start].score:
            stop += 1
        got_ids = {h.id for h in got[start:stop]}
        if stop < len(expected):
            assert got_ids == {h.id for h in expected[start:stop]}
        else:
            assert got_ids <= {h.id for h in deeper if h.score == expected[start].score}
        start = stop


def test_sharded_matches_bm25s_on_the_fixture_questions(fixture_indexes, fixture_questions):
    bm25s, sharded = fixture_indexes["bm25s"].retriever("bm25"), fixture_indexes["shards"].retriever("bm25")
    assert isinstance(sharded, ShardedBM25Retriever) and len(sharded.shards) == 5
    expected, deeper = bm25s.search(fixture_questions, 10), bm25s.search(fixture_questions, 50)
    got = sharded.search(fixture_questions, 10)
    assert sum(len(hits) == 10 for hits in got) == len(fixture_questions) == 157
    for e, g, d in zip(expected, got, deeper):
        assert_same_ranking(e, g, d)
    identical = sum([h.id for h in e] == [h.id for h in g] for e, g in zip(expected, got))
    assert identical == len(expected), identical  # both order equal scores by row


def test_one_shard_equals_many_shards(fixture_indexes, fixture_questions):
    one, many = fixture_indexes["one"].retriever("bm25"), fixture_indexes["shards"].retriever("bm25")
    assert len(one.shards) == 1
    assert one.search(fixture_questions, 25) == many.search(fixture_questions, 25)
    manifest = fixture_indexes["shards"].manifest["bm25"]
    assert manifest["backend"] == "sharded" and (manifest["shard_size"], manifest["shards"]) == (300, 5)
    assert (manifest["k1"], manifest["b"], manifest["stemmer"], manifest["title_weight"]) == (1.5, 0.75, "english", 4)


def test_scores_by_hand_with_a_passage_of_stopwords_only(tmp_path):
    # "The of and" has no terms: it counts length 1 (bm25s gives it an empty token), so avgdl = (2 + 3 + 1) / 3
    docs = [Passage("a", "", "apples banana"), Passage("b", "", "apple apple cherry"), Passage("c", "", "The of and")]
    build_index(docs, tmp_path / "ix", bm25_backend="sharded", shard_size=2)
    retriever = open_index(tmp_path / "ix").retriever("bm25")
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    score_b = idf * 2 / (2 + 1.5 * (1 - 0.75 + 0.75 * 3 / 2))
    score_a = idf * 1 / (1 + 1.5 * (1 - 0.75 + 0.75 * 2 / 2))
    hits = retriever.search(["Apples?", "apple apple", "durian", "the"], k=3)
    assert [h.id for h in hits[0]] == ["b", "a"]
    assert [h.score for h in hits[0]] == pytest.approx([score_b, score_a], rel=1e-6)
    assert [h.score for h in hits[1]] == pytest.approx([2 * score_b, 2 * score_a], rel=1e-6)  # a repeat counts
    assert hits[2] == [] and hits[3] == []  # unknown word, stopword: no hits, not zero-score ones
    build_index(docs, tmp_path / "bm25s")
    assert retriever.search(["apple apple cherry"], 3) == open_index(tmp_path / "bm25s").retriever().search(
        ["apple apple cherry"], 3)


def test_sharded_rebuild_gives_identical_files(tmp_path):
    passages = word_passages(n=120)
    build_index(passages, tmp_path / "one", bm25_backend="sharded", shard_size=50)
    build_index(passages, tmp_path / "two", bm25_backend="sharded", shard_size=50)
    files = folder_digest(tmp_path / "one")
    assert files == folder_digest(tmp_path / "two")
    assert {"bm25/shard-00002/weights.npy", "bm25/terms.bin", "bm25/stats.json"} <= set(files)
    assert not any(".scratch" in name for name in files)


def test_chunks_within_passes_change_no_byte(tmp_path, fixtures_dir, monkeypatch):
    corpus = str(fixtures_dir / "corpus.jsonl")
    build_index(Corpus(corpus), tmp_path / "whole", bm25_backend="sharded", shard_size=700)
    monkeypatch.setattr(bm25_sharded, "_READ_CHUNK", 97)  # pass 1 counts df over many batches
    monkeypatch.setattr(bm25_sharded, "_WRITE_CHUNK", 64)  # pass 2 scatters many sorted pieces into a shard
    build_index(Corpus(corpus), tmp_path / "pieces", bm25_backend="sharded", shard_size=700)
    assert folder_digest(tmp_path / "whole") == folder_digest(tmp_path / "pieces")


def test_cli_build_and_search_a_sharded_index(tmp_path):
    rows = [{"id": f"w{i}", "contents": f'"Title {i}"\nPassage number {i} about topic{i % 7}.'} for i in range(40)]
    corpus = write_corpus(tmp_path / "wiki.jsonl", rows)
    result = run_cli("index", "wiki", "--corpus", corpus, "--out", tmp_path / "wiki", "--shard-size", "16")
    assert result.exit_code == 0, result.stderr
    assert "BM25 terms (pass 1)" in result.stderr and "BM25 shards" in result.stderr
    manifest = orjson.loads((tmp_path / "wiki" / "index.manifest.json").read_bytes())
    assert (manifest["bm25"]["backend"], manifest["bm25"]["shards"], manifest["options"]["shard_size"]) == (
        "sharded", 3, 16)
    found = run_cli("search", "--index", tmp_path / "wiki", "topic3 title 17", "-k", "3")
    assert found.exit_code == 0, found.stderr
    assert [line.split("\t")[2] for line in found.stdout.splitlines()] == ["w17", "w3", "w10"]
    built = run_cli("index", "build", "--corpus", corpus, "--out", tmp_path / "plain", "--quiet")
    plain = orjson.loads((tmp_path / "plain" / "index.manifest.json").read_bytes())
    assert built.exit_code == 0 and plain["bm25"]["backend"] == "bm25s" and "shard_size" not in plain["options"]


@pytest.mark.parametrize("lines, message", [
    ([b'{"id": "p1", "title": "a", "text": "b"}', b'{"id": "p9", "title": "x", "text": '],
     r"corpus.jsonl:2: not valid JSON .* - each line must be"),
    ([], r"corpus.jsonl: the corpus is empty - pass a JSONL file"),
])
def test_bad_corpus_with_the_sharded_backend_is_one_line_exit_3(tmp_path, lines, message):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b"".join(line + b"\n" for line in lines))
    result = run_cli("index", "wiki", "--corpus", corpus, "--out", tmp_path / "ix", "--quiet")
    assert result.exit_code == 3 and len(result.stderr.strip().splitlines()) == 1
    assert re.search(message, result.stderr), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]  # no index, no temp folder


def test_bad_backend_and_shard_size_exit_4(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", [{"id": "p1", "title": "a", "text": "b"}])
    zero = run_cli("index", "build", "--corpus", corpus, "--out", tmp_path / "ix", "--bm25-backend", "sharded",
                   "--shard-size", "0")
    assert zero.exit_code == 4 and "shard size 0 is not positive" in zero.stderr
    other = run_cli("index", "build", "--corpus", corpus, "--out", tmp_path / "ix", "--bm25-backend", "lucene")
    assert other.exit_code == 4 and "use bm25s, sharded, pyserini" in other.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]
