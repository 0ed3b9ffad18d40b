"""ivfpq-refine: IVF-PQ candidates scored exactly from fp16 vectors on disk, built in chunks, memory-mapped."""

import math

import numpy as np
import orjson
import pytest

from conftest import run_cli
from cosearch_cli.errors import ConfigError, IndexError_
from cosearch_cli.index import build_index, open_index
from cosearch_cli.index import dense
from test_evaluate_cli import one_line_error
from test_index import tiny_encoder, word_passages, write_corpus

# fp16 keeps 11 significant bits: each component of a passage vector v moves by at most 2^-11 of itself, so
# for unit vectors |q . v - q . fp16(v)| <= |q| |v - fp16(v)| <= 2^-11 = 4.9e-4 (plus float32 sums, ~1e-6)
FP16_SCORE_TOLERANCE = 2.0 ** -11 + 1e-6


def unit_vectors(n, dim, seed):
    vectors = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def clustered(n, dim=64, clusters=50, spread=0.5, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(clusters, dim))
    vectors = (centers[rng.integers(0, clusters, size=n)] + spread * rng.normal(size=(n, dim))).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def recall(found, exact):
    return float(np.mean([len(set(a) & set(e)) / len(e) for a, e in zip(found, exact)]))


def test_pool_covering_the_corpus_gives_flat_ids_and_scores_within_fp16_rounding(tmp_path):
    vectors, queries = unit_vectors(600, 32, seed=0), unit_vectors(25, 32, seed=1)
    dense.write_refined(vectors, tmp_path / "r.faiss")
    index = dense.read_refined(tmp_path / "r.faiss")
    index.nprobe = 10_000  # capped at the list count: every list visited
    index.refine_factor = math.ceil(600 / 10)  # 60 x k=10 = 600 candidates: the whole corpus
    assert index.nprobe == index.ivfpq.nlist
    scores, rows = index.search(queries, 10)
    flat_scores, flat_rows = dense.build_faiss(vectors, "flat").search(queries, 11)
    np.testing.assert_allclose(scores, flat_scores[:, :10], rtol=0, atol=FP16_SCORE_TOLERANCE)
    # the scores are exactly the inner products with the stored fp16 vectors, so the order is theirs ...
    by_hand = queries @ vectors.astype(np.float16).astype(np.float32).T
    np.testing.assert_allclose(scores, np.take_along_axis(by_hand, rows, axis=1), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(rows, np.argsort(-by_hand, axis=1, kind="stable")[:, :10])
    # ... which is flat's at every rank whose flat score is further than two fp16 shifts from both neighbours
    # (fp16 cannot swap those): 198 of the 250 ranks; of the other 52, in near ties, 4 are swapped
    gaps = np.diff(-flat_scores, axis=1)  # (25, 10): score at rank r minus score at rank r + 1
    before = np.concatenate([np.full((25, 1), np.inf), gaps[:, :-1]], axis=1)
    safe = np.minimum(before, gaps) > 2 * FP16_SCORE_TOLERANCE
    assert (safe.sum(), (rows != flat_rows[:, :10]).sum()) == (198, 4)
    np.testing.assert_array_equal(rows[safe], flat_rows[:, :10][safe])


def test_recall_at_default_settings_on_clustered_vectors(tmp_path):
    corpus, queries = clustered(4800), clustered(200, seed=1)
    dense.write_refined(corpus, tmp_path / "r.faiss")
    index = dense.read_refined(tmp_path / "r.faiss")
    ivfpq = dense.build_faiss(corpus, "ivfpq")
    # 4,800 vectors: 123 lists, 8 sub-quantisers of 6 bits (8 bytes a vector against flat's 256)
    assert (index.ivfpq.nlist, index.ivfpq.pq.M, index.ivfpq.pq.nbits) == (123, 8, 6)
    assert (dense.NPROBE, dense.REFINE_FACTOR) == (128, 16)
    assert (index.nprobe, index.refine_factor) == (123, 16)  # nprobe is capped at the lists there are
    _, exact = dense.build_faiss(corpus, "flat").search(queries, 10)
    _, refined = index.search(queries, 10)
    _, approximate = ivfpq.search(queries, 10)
    # measured when written: refined 0.998, ivfpq alone 0.335 (a random top 10 would give 0.002)
    assert recall(refined, exact) >= 0.95
    assert recall(approximate, exact) < 0.5


def test_build_reads_the_vectors_in_chunks_and_trains_on_a_sample(tmp_path, monkeypatch):
    class Recorded:
        """An array that notes how many rows each read returns (a stand-in for a memory map)."""

        def __init__(self, values):
            self.values, self.shape, self.reads = values, values.shape, []

        def __getitem__(self, key):
            part = self.values[key]
            self.reads.append(len(part))
            return part

    vectors = clustered(3000)
    source = Recorded(vectors)
    monkeypatch.setattr(dense, "TRAIN_ROWS", 1000)
    dense.write_refined(source, tmp_path / "r.faiss", ivf_lists=20, chunk=700)
    # training wants max(TRAIN_ROWS, 40 x 20 lists) = 1,000 of the 3,000 rows (one seeded sample), then the
    # rows are added 700 at a time: no read returns the whole matrix
    assert source.reads == [1000, 700, 700, 700, 700, 200]
    stored = np.load(dense.refined_vectors_path(tmp_path / "r.faiss"))
    assert stored.dtype == np.float16 and stored.shape == (3000, 64)
    np.testing.assert_array_equal(stored, vectors.astype(np.float16))


def test_opened_files_are_memory_mapped_not_loaded(tmp_path):
    dense.write_refined(unit_vectors(500, 16, seed=0), tmp_path / "r.faiss")
    index = dense.read_refined(tmp_path / "r.faiss")
    assert isinstance(index.vectors, np.memmap) and index.vectors.mode == "r"
    assert str(index.vectors.filename) == str(dense.refined_vectors_path(tmp_path / "r.faiss").resolve())
    maps = open("/proc/self/maps").read()  # both files are mapped into this process (Linux)
    assert str((tmp_path / "r.faiss").resolve()) in maps
    assert str(dense.refined_vectors_path(tmp_path / "r.faiss").resolve()) in maps


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return tiny_encoder(tmp_path_factory.mktemp("enc") / "tiny-bert")


@pytest.fixture(scope="module")
def refined_folder(tmp_path_factory, encoder_dir):
    """`cosearch index build --dense-index ivfpq-refine --dense-index flat` over 40 word passages."""
    tmp = tmp_path_factory.mktemp("refined")
    corpus = write_corpus(tmp / "corpus.jsonl", [{"id": p.id, "title": p.title, "text": p.text}
                                                 for p in word_passages()])
    result = run_cli("index", "build", "--corpus", corpus, "--out", tmp / "ix", "--no-bm25", "--dense", encoder_dir,
                     "--dense-index", "ivfpq-refine", "--dense-index", "flat", "--no-cache", "--quiet")
    assert result.exit_code == 0, result.stderr
    return tmp / "ix"


def test_cli_build_and_search_round_trip_matches_flat(tmp_path, refined_folder):
    manifest = orjson.loads((refined_folder / "index.manifest.json").read_bytes())
    assert manifest["dense"]["index_types"] == ["ivfpq-refine", "flat"]
    assert (manifest["dense"]["nprobe"], manifest["dense"]["refine_factor"]) == (128, 16)
    assert sorted(p.name for p in (refined_folder / "dense").iterdir()) == [
        "flat.faiss", "ivfpq-refine.f16.npy", "ivfpq-refine.faiss"]
    searched = {}
    for kind in ("ivfpq-refine", "flat"):
        result = run_cli("search", "--index", refined_folder, "--dense-index", kind, "-k", "5", "apple banana tiger")
        assert result.exit_code == 0, result.stderr
        searched[kind] = [line.split("\t") for line in result.stdout.splitlines()]
    # 40 passages, one list, 16 x 5 = 80 candidates: the pool is the corpus, so the top 5 are flat's
    assert [row[2] for row in searched["ivfpq-refine"]] == [row[2] for row in searched["flat"]]
    for ours, flat in zip(searched["ivfpq-refine"], searched["flat"]):
        assert abs(float(ours[1]) - float(flat[1])) <= 1e-3  # printed with 4 decimals; fp16 moves <= 4.9e-4
    retriever = open_index(refined_folder).retriever("dense", index_type="ivfpq-refine")
    assert isinstance(retriever.index, dense.RefinedIndex) and isinstance(retriever.index.vectors, np.memmap)


@pytest.mark.parametrize("damage", ["missing", "truncated", "wrong shape"])
def test_damaged_or_missing_vectors_file_exits_6_with_one_line_fix(tmp_path, refined_folder, damage):
    import shutil

    folder = tmp_path / "ix"
    shutil.copytree(refined_folder, folder)
    path = folder / "dense" / "ivfpq-refine.f16.npy"
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:-100])
    else:
        np.save(path, np.zeros((39, 32), dtype=np.float16))
    result = run_cli("search", "--index", folder, "--dense-index", "ivfpq-refine", "apple")
    one_line_error(result, 6, "ivfpq-refine.f16.npy", "rebuild the index")
    if damage == "wrong shape":
        assert "holds float16 (39, 32), the index needs float16 (40, 32)" in result.stderr
    with pytest.raises(IndexError_):  # the flat index of the same folder still opens
        open_index(folder).retriever("dense", index_type="ivfpq-refine")
    assert open_index(folder).retriever("dense", index_type="flat").search(["apple"], 1)


def test_nprobe_and_refine_factor_must_be_positive(tmp_path, encoder_dir):
    result = run_cli("index", "build", "--corpus", write_corpus(tmp_path / "c.jsonl", [{"id": "1", "title": "a",
                                                                                         "text": "apple"}]),
                     "--out", tmp_path / "ix", "--dense", encoder_dir, "--dense-index", "ivfpq-refine",
                     "--refine-factor", "0")
    one_line_error(result, 4, "refine factor 0", "--refine-factor")
    assert not (tmp_path / "ix").exists()
    with pytest.raises(ConfigError, match="nprobe 0 and refine factor 16 must be positive"):
        build_index(word_passages(), tmp_path / "lib", bm25=False, dense=str(encoder_dir), nprobe=0)


def test_fewer_candidates_than_k_are_padded_like_faiss(tmp_path):
    vectors = clustered(2000)
    dense.write_refined(vectors, tmp_path / "r.faiss", ivf_lists=40)
    index = dense.read_refined(tmp_path / "r.faiss")
    index.nprobe, index.refine_factor = 1, 1  # one list of ~50 vectors cannot fill k=200
    scores, rows = index.search(vectors[:3], 200)
    listed = index.ivfpq.search(vectors[:3], 200)[1]
    for score, row, found in zip(scores, rows, listed):
        real = found[found >= 0]
        assert 0 < len(real) < 200
        assert sorted(row[: len(real)]) == sorted(real) and (row[len(real):] == -1).all()
        assert np.isneginf(score[len(real):]).all() and (np.diff(score[: len(real)]) <= 0).all()


def test_encoding_writes_vectors_to_disk_chunk_by_chunk(tmp_path, encoder_dir):
    encoder = dense.HFEncoder(str(encoder_dir))
    passages = word_passages(10)
    seen = []
    mapped = dense.encode_corpus(encoder, iter(passages), chunk=4, out=tmp_path / "v.npy", count=10,
                                 on_progress=seen.append)
    assert isinstance(mapped, np.memmap) and seen == [4, 4, 2]
    np.testing.assert_allclose(mapped, dense.encode_corpus(encoder, passages), atol=1e-6)
    # a build that encodes keeps no copy of them in the index folder
    build_index(passages, tmp_path / "ix", bm25=False, dense=str(encoder_dir), dense_index="ivfpq-refine",
                cache_embeddings=False)
    assert sorted(p.name for p in (tmp_path / "ix").rglob("*") if "embeddings" in p.name) == []
