"""Index library: corpus forms, doc store, hand-computed BM25, dense encoders, FAISS types, rebuild identity."""

import hashlib
import math

import numpy as np
import orjson
import pytest

from cosearch_cli.errors import IndexError_, RecordError
from cosearch_cli.index import Corpus, build_index, open_index
from cosearch_cli.index.corpus import passage_from_row, split_contents
from cosearch_cli.index.bm25 import tokenize_queries, top_rows
from cosearch_cli.index.dense import HFEncoder, build_faiss
from cosearch_cli.records import Passage

WORDS = ("apple banana cherry durian elder fig grape hazel iris juniper kiwi lemon mango nectar olive pear "
         "quince river stone tiger").split()


def tiny_encoder(folder):
    """A randomly initialised 2-layer BERT with a word-level vocabulary, saved like any HF encoder folder."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "query", "passage", ":", '"', *WORDS]
    BertTokenizer(vocab={word: i for i, word in enumerate(vocab)}).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    BertModel(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny-bert")


def write_corpus(path, rows):
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    return path


def word_passages(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return [Passage(f"p{i:03d}", WORDS[i % len(WORDS)], " ".join(rng.choice(WORDS, size=8))) for i in range(n)]


def folder_digest(folder):
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_both_corpus_forms_give_the_same_passage():
    plain = passage_from_row({"id": 7, "title": "Paris", "text": "Capital of France."}, "c.jsonl", 1)
    flashrag = passage_from_row({"id": "7", "contents": '"Paris"\nCapital of France.'}, "c.jsonl", 1)
    assert plain == flashrag == Passage("7", "Paris", "Capital of France.")
    assert split_contents("no title line") == ("", "no title line")
    assert split_contents('"A "quoted" title"\nbody\nmore') == ('A "quoted" title', "body\nmore")
    with pytest.raises(RecordError, match="missing field 'text'") as info:
        passage_from_row({"id": "x", "title": "T"}, "c.jsonl", 4)
    assert (info.value.path, info.value.line) == ("c.jsonl", 4)


def test_bm25_scores_match_lucene_formula_by_hand(tmp_path):
    docs = [Passage("a", "", "apples banana"), Passage("b", "", "apple apple cherry"), Passage("c", "", "durian")]
    build_index(docs, tmp_path / "ix")
    hits = open_index(tmp_path / "ix").retriever("bm25").search(["Apples?"], k=3)[0]  # stemmed: apples = apple
    # Lucene BM25, k1=1.5, b=0.75: idf = ln(1 + (N - df + .5) / (df + .5)); avgdl = (2 + 3 + 1) / 3 = 2
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))
    score_b = idf * 2 / (2 + 1.5 * (1 - 0.75 + 0.75 * 3 / 2))
    score_a = idf * 1 / (1 + 1.5 * (1 - 0.75 + 0.75 * 2 / 2))
    assert [h.id for h in hits] == ["b", "a"]  # "c" does not contain the term: no hit, not a zero-score one
    assert hits[0].score == pytest.approx(score_b, rel=1e-5) and hits[1].score == pytest.approx(score_a, rel=1e-5)


def test_fixture_index_finds_passages_and_doc_store_reads_them(tmp_path, fixtures_dir):
    corpus = Corpus(str(fixtures_dir / "corpus.jsonl"))
    manifest = build_index(corpus, tmp_path / "ix")
    index = open_index(tmp_path / "ix")
    lines = (fixtures_dir / "corpus.jsonl").read_bytes().splitlines()
    assert len(index.docs) == len(lines) == manifest["corpus"]["passages"]
    assert manifest["inputs"] == {str(fixtures_dir / "corpus.jsonl"): hashlib.sha256(
        (fixtures_dir / "corpus.jsonl").read_bytes()).hexdigest()}
    picks = [orjson.loads(lines[i]) for i in (0, 700, len(lines) - 1)]
    assert index.docs.get([p["id"] for p in reversed(picks)]) == [Passage(**p) for p in reversed(picks)]
    results = index.retriever().search([f"{p['title']} {p['text'][:80]}" for p in picks], k=5)
    assert [r[0].id for r in results] == [p["id"] for p in picks]
    assert all(len(r) == 5 and r[0].score >= r[-1].score for r in results)
    with pytest.raises(IndexError_, match="'no-such-id' is not in this index"):
        index.docs.get(["no-such-id"])


def test_search_pauses_the_collector_inside_and_restores_its_state(tmp_path):
    import gc

    build_index(word_passages(), tmp_path / "ix")
    retriever = open_index(tmp_path / "ix").retriever("bm25")
    seen = []
    score = retriever.model.get_scores_from_ids
    retriever.model.get_scores_from_ids = lambda *a, **kw: (seen.append(gc.isenabled()), score(*a, **kw))[1]
    try:
        assert gc.isenabled()
        hits = retriever.search(["apple banana"], k=3)
        assert seen == [False] and gc.isenabled() and len(hits[0]) == 3
        gc.disable()  # a caller that paused it itself keeps it paused
        retriever.search(["apple"], k=3)
        assert seen == [False, False] and not gc.isenabled()
    finally:
        gc.enable()


def test_top_rows_keeps_the_k_highest_positive_scores_with_ties_in_row_order():
    scores = np.array([0.0, 2.0, 5.0, 2.0, 0.0, 7.0, 2.0, 1.0], dtype=np.float32)
    # by hand: 7 (row 5), 5 (row 2), then the 2s in row order: 1, 3, 6; then 1 (row 7); zeros never
    assert top_rows(scores, 3).tolist() == [5, 2, 1]
    assert top_rows(scores, 4).tolist() == [5, 2, 1, 3]
    assert top_rows(scores, 6).tolist() == [5, 2, 1, 3, 6, 7]
    assert top_rows(scores, 8).tolist() == [5, 2, 1, 3, 6, 7]  # only 6 rows match
    assert top_rows(np.zeros(4, dtype=np.float32), 2).tolist() == []


def test_bm25_search_returns_the_scores_of_bm25s_retrieve(fixture_bm25, fixtures_dir):
    """The same top-k scores as bm25s's own `retrieve` for every fixture question, and the same passages above
    the k-th score, ours best first and equal scores by row. At the k-th score itself bm25s keeps whichever tied
    passages np.argpartition leaves (they may lie beyond the cut); ours are the tied passages of lowest row, by
    bm25s's full score vector."""
    questions = [orjson.loads(line)["question"] for name in ("dev.jsonl", "train.jsonl")
                 for line in (fixtures_dir / name).read_bytes().splitlines() if line]
    retriever = fixture_bm25.retriever("bm25")
    got = retriever.search(questions, 10)
    assert sum(len(hits) == 10 for hits in got) > 100
    tokens = tokenize_queries(questions, retriever.stemmer, retriever.stopwords)
    rows, scores = retriever.model.retrieve(tokens, k=10, show_progress=False)
    ties_at_the_cut = 0
    for hits, query, expected_rows, expected_scores in zip(got, tokens, rows, scores):
        keep = expected_scores > 0
        assert [h.score for h in hits] == expected_scores[keep].tolist()
        if not hits:
            continue
        cut = hits[-1].score
        above = expected_scores[keep] > cut
        full = retriever.model.get_scores(query)
        order = sorted(expected_rows[keep][above].tolist(), key=lambda row: (-full[row], row))
        assert [h.id for h in hits if h.score > cut] == list(retriever.row_ids.take(order))  # equal scores by row
        tied_rows = np.flatnonzero(full == np.float32(cut))  # ascending rows
        assert set(expected_rows[keep][~above]) <= set(tied_rows.tolist())
        ours = [h.id for h in hits if h.score == cut]
        assert ours == list(retriever.row_ids.take(tied_rows[:len(ours)]))
        ties_at_the_cut += len(hits) == 10 and len(tied_rows) > len(ours)
    assert ties_at_the_cut > 0  # the fixture questions do meet ties at the cut, so the rule above is exercised


def test_rebuild_gives_identical_files_and_failed_build_leaves_nothing(tmp_path):
    passages = word_passages()
    build_index(passages, tmp_path / "one")
    build_index(passages, tmp_path / "two")
    assert folder_digest(tmp_path / "one") == folder_digest(tmp_path / "two")
    with pytest.raises(RecordError, match="duplicate passage id 'p001'"):
        build_index([*passages, passages[1]], tmp_path / "three")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one", "two"]


def test_hf_encoder_prefixes_and_mean_pooling_ignore_padding(encoder_dir):
    encoder = HFEncoder(str(encoder_dir), batch_size=4)
    assert encoder.prefixes and encoder.dim == 32
    texts = ["apple", "banana cherry durian elder fig grape", "kiwi lemon"]
    together = encoder._encode(texts)  # one padded batch
    alone = np.concatenate([encoder._encode([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(encoder.encode_queries(["apple"]), encoder._encode(["query: apple"]), atol=1e-6)
    passage = Passage("1", "fig", "kiwi")
    np.testing.assert_allclose(encoder.encode_passages([passage]), encoder._encode(['passage: "fig"\nkiwi']),
                               atol=1e-6)


def test_dense_index_matches_brute_force_and_refuses_another_encoder(tmp_path, encoder_dir):
    passages = word_passages()
    manifest = build_index(passages, tmp_path / "ix", bm25=False, dense=str(encoder_dir),
                           dense_index=["flat", "hnsw"], cache_embeddings=False)
    assert manifest["dense"]["encoder"] == str(encoder_dir.resolve()) and "bm25" not in manifest
    index = open_index(tmp_path / "ix")
    queries = ["apple banana", "tiger stone river"]
    encoder = HFEncoder(str(encoder_dir))
    expected = encoder.encode_queries(queries) @ encoder.encode_passages(passages).T
    flat = index.retriever().search(queries, k=5)
    for row, hits in zip(expected, flat):
        assert [h.id for h in hits] == [passages[i].id for i in np.argsort(-row, kind="stable")[:5]]
        np.testing.assert_allclose([h.score for h in hits], np.sort(row)[::-1][:5], atol=1e-5)
    hnsw = index.retriever("dense", index_type="hnsw").search(queries, k=5)
    assert [h.id for h in hnsw[0]] == [h.id for h in flat[0]]  # 40 vectors: HNSW search is exact here
    with pytest.raises(IndexError_, match=r"built with encoder '.*tiny-bert', not 'minilm'"):
        index.retriever("dense", encoder="minilm")
    with pytest.raises(IndexError_, match="no bm25 retriever"):
        index.retriever("bm25")


def test_build_from_precomputed_embeddings_reads_only_the_encoder_config(tmp_path, encoder_dir, monkeypatch):
    import faiss

    from cosearch_cli.errors import ConfigError
    from cosearch_cli.index import dense

    passages = word_passages()
    build_index(passages, tmp_path / "encoded", bm25=False, dense=str(encoder_dir), cache_embeddings=False)
    vectors = faiss.read_index(str(tmp_path / "encoded" / "dense" / "flat.faiss")).reconstruct_n(0, len(passages))

    def no_weights(*args, **kwargs):
        raise AssertionError("the encoder weights were loaded")

    monkeypatch.setattr(dense, "HFEncoder", no_weights)
    build_index(passages, tmp_path / "given", bm25=False, dense=str(encoder_dir), embeddings=vectors)
    assert folder_digest(tmp_path / "given") == folder_digest(tmp_path / "encoded")  # manifest included
    with pytest.raises(ConfigError, match=r"precomputed embeddings have shape \(40, 16\), the corpus needs "
                                          r"\(40, 32\)"):
        build_index(passages, tmp_path / "wrong", bm25=False, dense=str(encoder_dir), embeddings=vectors[:, :16])
    assert not (tmp_path / "wrong").exists()


def test_ivfpq_recall_against_flat_on_clustered_vectors():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(20, 32))
    vectors = (centers[rng.integers(0, 20, size=2000)] + 0.3 * rng.normal(size=(2000, 32))).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    flat, ivfpq = build_faiss(vectors, "flat"), build_faiss(vectors, "ivfpq")
    # 32 dims / 8 per sub-vector; 2,000 vectors train 5-bit codes (8 bits need 256 x 39): 3 bytes vs flat's 128
    assert (ivfpq.pq.M, ivfpq.pq.nbits, ivfpq.code_size) == (4, 5, 3)
    _, exact = flat.search(vectors[:50], 10)
    _, approx = ivfpq.search(vectors[:50], 10)
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)])
    self_found = np.mean([i in row for i, row in enumerate(approx)])
    assert recall > 0.15 and self_found > 0.4, (recall, self_found)  # a random top-10 would give 0.005


def test_open_index_errors(tmp_path):
    with pytest.raises(IndexError_, match="no index folder here") as info:
        open_index(tmp_path / "missing")
    assert "cosearch index" in info.value.fix
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexError_, match="not a cosearch index"):
        open_index(tmp_path / "empty")
