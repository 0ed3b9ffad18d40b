"""Sharded BM25 with global statistics: the bm25s scores in memory that does not grow with the corpus.

bm25.py (bm25s) holds every passage's token ids and the whole score matrix in memory: tens of GB for the
21M passages of wiki-18. This backend gives the same scores (Lucene BM25, the same tokens, stopwords, stemmer,
title weight, k1 and b; tests/test_index_sharded.py checks it against bm25s) in two streaming passes:

  pass 1  tokenise every passage once; write its term ids to a scratch file; count document frequencies.
          In memory: the vocabulary (term -> id, df) and a bounded word -> term cache.
  pass 2  shard by shard (`shard_size` passages), read the scratch ids back and write the shard's BM25
          weights with the GLOBAL idf and average length, term-major. In memory: one shard's postings.

Layout of the bm25/ folder:
  terms.bin, terms_offsets.npy   the vocabulary as UTF-8, sorted (term id = position), found by binary search
  df.npy                         documents containing each term (int64)
  stats.json                     passages, total and average length, terms, settings, the shards
  shard-00000/terms.npy          the term ids that occur in the shard (int32, ascending)
              indptr.npy         where each of those terms' postings start (int64, one more entry)
              rows.npy           rows within the shard (uint32, ascending within a term)
              weights.npy        idf(term) * tf / (tf + k1 (1 - b + b dl / avgdl)), float32
All arrays are memory-mapped when searching; a query touches only its own terms' postings.

A passage without any term counts length 1, as in bm25s (which gives it an empty token).
"""

from __future__ import annotations

import bisect
import itertools
import mmap
import re
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import orjson

from cosearch_cli.errors import ConfigError, IndexError_
from cosearch_cli.gcpause import paused_gc
from cosearch_cli.index.bm25 import B, K1, STEMMER, STOPWORDS, TITLE_WEIGHT, document_text, import_bm25s
from cosearch_cli.index.docstore import RowIds
from cosearch_cli.records import Hit, Passage

SHARD_SIZE = 1_000_000
STATS = "stats.json"
_WORDS = re.compile(r"(?u)\b\w\w+\b")  # bm25s's splitter: words of two or more word characters
_READ_CHUNK = 10_000  # passages tokenised per numpy step in pass 1
_WRITE_CHUNK = 20_000  # passages per sort in pass 2 (~70 bytes a posting while sorted)
_WORD_CACHE = 1 << 20  # surface words remembered while building (cleared when full: memory stays bounded)
_STOP = -1  # word id of a stopword


class Analyzer:
    """Text -> terms as bm25s makes them with our settings: lower case, words of two or more word characters,
    English stopwords dropped (before stemming), Snowball stem."""

    def __init__(self, stemmer: str | None = STEMMER, stopwords: str | None = STOPWORDS):
        if stopwords not in (None, "en", "english"):
            raise ConfigError(f"the sharded BM25 backend has no stopword list {stopwords!r}",
                              fix="use 'en' or none")
        if stopwords:
            self.stopwords = frozenset(import_bm25s().stopwords.STOPWORDS_EN)
        else:
            self.stopwords = frozenset()
        if stemmer:
            import Stemmer
            self.stem = Stemmer.Stemmer(stemmer).stemWord
        else:
            self.stem = str
        self.split = _WORDS.findall

    def terms(self, text: str) -> list[str]:
        return [self.stem(w) for w in self.split(text.lower()) if w not in self.stopwords]


class _Vocabulary:
    """Pass 1's growing vocabulary: term -> id in order of first sight, and each term's document frequency."""

    def __init__(self, analyzer: Analyzer):
        self.analyzer = analyzer
        self.term_ids: dict[str, int] = {}
        self.df = np.zeros(1 << 16, dtype=np.int64)
        self._word_ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        """Term ids of the words of `text` in order, _STOP for stopwords."""
        words = self.analyzer.split(text.lower())
        ids = [self._word_ids.get(w, -2) for w in words]
        if -2 in ids:
            ids = [i if i != -2 else self._learn(w) for i, w in zip(ids, words)]
        return ids

    def _learn(self, word: str) -> int:
        if word in self.analyzer.stopwords:
            term_id = _STOP
        else:
            term_id = self.term_ids.setdefault(self.analyzer.stem(word), len(self.term_ids))
        self._word_ids[word] = term_id
        return term_id

    def count(self, doc_terms: np.ndarray) -> None:
        """Add one to the df of each distinct term of each document; `doc_terms` is (doc << 32) | term."""
        if len(self.term_ids) > len(self.df):
            self.df = np.concatenate([self.df, np.zeros(max(len(self.df), len(self.term_ids)), dtype=np.int64)])
        distinct = np.unique(doc_terms) & 0xFFFFFFFF
        self.df[:len(self.term_ids)] += np.bincount(distinct, minlength=len(self.term_ids))
        if len(self._word_ids) > _WORD_CACHE:
            self._word_ids.clear()


def build_sharded_bm25(passages: Iterable[Passage], folder: Path, *, shard_size: int = SHARD_SIZE,
                       k1: float = K1, b: float = B, stemmer: str | None = STEMMER,
                       stopwords: str | None = STOPWORDS, title_weight: int = TITLE_WEIGHT,
                       on_shard: Callable[[int], None] | None = None) -> dict:
    """Index `passages` (in doc-store row order) into `folder`; returns the stats written to stats.json.

    `on_shard(n)` is called after each shard is written with its number of passages (pass 2's progress)."""
    assert shard_size >= 1, f"shard size {shard_size} is not positive (build_index checks it)"
    folder.mkdir(parents=True)
    scratch = folder / ".scratch"
    scratch.mkdir()
    vocab = _Vocabulary(Analyzer(stemmer, stopwords))
    with open(scratch / "tokens.bin", "wb") as tokens, open(scratch / "lengths.bin", "wb") as lengths:
        n_docs, total_length = _tokenise(passages, vocab, title_weight, tokens, lengths)
    remap = _write_vocabulary(vocab, folder)
    df = np.zeros(len(remap), dtype=np.int64)
    df[remap] = vocab.df[:len(remap)]
    del vocab  # pass 2 needs only the ids: the dictionaries go
    np.save(folder / "df.npy", df)
    avgdl = total_length / n_docs if n_docs else 0.0
    # bm25s keeps idf as float32 and multiplies it by the float64 tf part: so do we, for the same scores
    idf = np.log(1 + (n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
    shards, first_token = [], 0
    with open(scratch / "tokens.bin", "rb") as tokens, open(scratch / "lengths.bin", "rb") as lengths:
        for start in range(0, n_docs, shard_size):
            doc_lengths = _read(lengths, np.int32, start, min(shard_size, n_docs - start))
            dl_norm = k1 * ((1 - b) + b * np.maximum(doc_lengths, 1).astype(np.float64) / avgdl)
            shards.append(_write_shard(folder / shard_name(len(shards)), tokens, first_token, doc_lengths,
                                       dl_norm, remap, idf, start))
            first_token += int(doc_lengths.sum(dtype=np.int64))
            if on_shard:
                on_shard(len(doc_lengths))
    shutil.rmtree(scratch)
    stats = {"passages": n_docs, "total_length": total_length, "avgdl": avgdl, "terms": len(remap),
             "k1": k1, "b": b, "method": "lucene", "stemmer": stemmer, "stopwords": stopwords,
             "title_weight": title_weight, "shard_size": shard_size, "shards": shards}
    (folder / STATS).write_bytes(orjson.dumps(stats, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return stats


def shard_name(i: int) -> str:
    return f"shard-{i:05d}"


def _tokenise(passages, vocab: _Vocabulary, title_weight: int, tokens, lengths) -> tuple[int, int]:
    """Pass 1: every passage's term ids (stopwords dropped) go to `tokens` (int32), their counts to `lengths`
    (int32); document frequencies go to `vocab.df`. Returns (passages, total length)."""
    n_docs = total_length = 0
    batch: list[list[int]] = []

    def flush() -> None:
        nonlocal n_docs, total_length
        raw = np.fromiter(itertools.chain.from_iterable(batch), dtype=np.int64)
        doc = np.repeat(np.arange(len(batch), dtype=np.int64), [len(ids) for ids in batch])
        keep = raw != _STOP
        raw, doc = raw[keep], doc[keep]
        counts = np.bincount(doc, minlength=len(batch)).astype(np.int32)
        vocab.count((doc << 32) | raw)
        tokens.write(raw.astype(np.int32).tobytes())
        lengths.write(counts.tobytes())
        n_docs += len(batch)
        total_length += int(np.maximum(counts, 1).sum())
        batch.clear()

    for passage in passages:
        batch.append(vocab.encode(document_text(passage, title_weight)))
        if len(batch) == _READ_CHUNK:
            flush()
    if batch:
        flush()
    return n_docs, total_length


def _write_vocabulary(vocab: _Vocabulary, folder: Path) -> np.ndarray:
    """Write the terms sorted (by code point, which is UTF-8 byte order); returns first-sight id -> sorted id."""
    terms = np.array(list(vocab.term_ids), dtype=object)
    order = np.argsort(terms, kind="stable") if len(terms) else np.zeros(0, dtype=np.int64)
    remap = np.empty(len(terms), dtype=np.int32)
    remap[order] = np.arange(len(terms), dtype=np.int32)
    sizes = np.zeros(len(terms) + 1, dtype=np.int64)
    with open(folder / "terms.bin", "wb") as handle:
        for block in range(0, len(terms), _READ_CHUNK):
            data = [term.encode() for term in terms[order[block:block + _READ_CHUNK]]]
            sizes[block + 1:block + 1 + len(data)] = [len(d) for d in data]
            handle.write(b"".join(data))
    np.save(folder / "terms_offsets.npy", np.cumsum(sizes))
    return remap


def _read(handle, dtype, start: int, count: int) -> np.ndarray:
    """`count` items from item `start` of a raw file (read, not mapped: memory is freed after the shard)."""
    handle.seek(start * np.dtype(dtype).itemsize)
    return np.fromfile(handle, dtype=dtype, count=count)


def _write_shard(folder: Path, tokens, first_token: int, doc_lengths: np.ndarray, dl_norm: np.ndarray,
                 remap: np.ndarray, idf: np.ndarray, start: int) -> dict:
    """Pass 2 for one shard (its passages' term counts `doc_lengths`, whose tokens start at `first_token` in
    the scratch file; `dl_norm` = k1 (1 - b + b dl / avgdl) per passage): the term-major postings.

    Two sweeps over the shard in chunks: the first counts each term's postings (so every term's slice of the
    output is known), the second scatters each chunk's (term, row) pairs, sorted, into those slices."""
    postings = np.zeros(len(remap) + 1, dtype=np.int64)
    for term, _row, _tf in _shard_pairs(tokens, doc_lengths, first_token, remap):
        runs = _runs(term)
        postings[term[runs[:-1]] + 1] += np.diff(runs)
    present = np.flatnonzero(postings[1:]).astype(np.int32)
    cursor = np.cumsum(postings)  # cursor[t]: where term t's next posting goes
    n = int(cursor[-1])
    rows, weights = np.empty(n, dtype=np.uint32), np.empty(n, dtype=np.float32)
    for term, row, tf in _shard_pairs(tokens, doc_lengths, first_token, remap):
        runs = _runs(term)
        run_start = np.repeat(runs[:-1], np.diff(runs))
        at = cursor[term] + (np.arange(len(term)) - run_start)
        rows[at] = row
        weights[at] = idf[term] * (tf / (dl_norm[row] + tf))
        cursor[term[runs[:-1]]] += np.diff(runs)
    indptr = np.concatenate([[0], np.cumsum(postings[1:][present])]).astype(np.int64)
    folder.mkdir()
    for name, array in (("terms", present), ("indptr", indptr), ("rows", rows), ("weights", weights)):
        np.save(folder / f"{name}.npy", array)
    return {"start": start, "passages": len(doc_lengths), "postings": n}


def _shard_pairs(tokens, doc_lengths: np.ndarray, first_token: int, remap: np.ndarray):
    """Per chunk of the shard: (term, row, tf) of its distinct (term, row) pairs, sorted by term then row."""
    token = first_token
    for c in range(0, len(doc_lengths), _WRITE_CHUNK):
        counts = doc_lengths[c:c + _WRITE_CHUNK]
        n_tokens = int(counts.sum(dtype=np.int64))
        ids = remap[_read(tokens, np.int32, token, n_tokens)].astype(np.int64)
        token += n_tokens
        if not n_tokens:
            continue
        keys = (ids << 32) | np.repeat(np.arange(c, c + len(counts), dtype=np.int64), counts)
        keys.sort()
        runs = _runs(keys)
        distinct = keys[runs[:-1]]
        yield (distinct >> 32).astype(np.int32), (distinct & 0xFFFFFFFF).astype(np.uint32), \
            np.diff(runs).astype(np.float64)


def _runs(sorted_values: np.ndarray) -> np.ndarray:
    """Start of every run of equal values, and the length at the end."""
    change = np.flatnonzero(sorted_values[1:] != sorted_values[:-1]) + 1
    return np.concatenate([[0], change, [len(sorted_values)]])


# ---------------------------------------------------------------------------------------------------------
# Searching


class _Terms(Sequence):
    """The sorted vocabulary as a sequence of bytes over memory maps (bisect finds a term's id)."""

    def __init__(self, folder: Path):
        self.offsets = np.load(folder / "terms_offsets.npy", mmap_mode="r")
        self._file = open(folder / "terms.bin", "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if self.offsets[-1] else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> bytes:
        return self._map[int(self.offsets[i]):int(self.offsets[i + 1])]

    def id(self, term: str) -> int | None:
        key = term.encode()
        i = bisect.bisect_left(self, key)
        return i if i < len(self) and self[i] == key else None


class _Shard:
    def __init__(self, folder: Path, start: int, passages: int):
        self.start, self.passages = start, passages
        self.terms, self.indptr, self.rows, self.weights = (
            np.load(folder / f"{name}.npy", mmap_mode="r") for name in ("terms", "indptr", "rows", "weights"))

    def top(self, term_ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, global rows) of the shard's k best passages for one query, unordered; only passages
        that contain a query term. Scores add up term by term in query order, in float32, as bm25s does."""
        where = np.searchsorted(self.terms, term_ids)
        scores = None
        for term, i in zip(term_ids, where.tolist()):
            if i == len(self.terms) or self.terms[i] != term:
                continue
            lo, hi = self.indptr[i], self.indptr[i + 1]
            if scores is None:
                scores = np.zeros(self.passages, dtype=np.float32)
            scores[self.rows[lo:hi]] += self.weights[lo:hi]  # rows are distinct within a term
        if scores is None:
            return np.zeros(0, dtype=np.float32), np.zeros(0, dtype=np.int64)
        rows = np.flatnonzero(scores)
        if len(rows) > k:  # the k best; of passages tied with the k-th, the first rows (as the merge orders)
            kth = np.partition(scores[rows], len(rows) - k)[len(rows) - k]
            above, tied = rows[scores[rows] > kth], rows[scores[rows] == kth]
            rows = np.concatenate([above, tied[:k - len(above)]])
        return scores[rows], rows + self.start


class ShardedBM25Retriever:
    """Batched top-k over a sharded BM25 folder: each shard's top k, merged; rows map to ids through `row_ids`.
    Equal scores are ordered by row (corpus order)."""

    name = "bm25"

    def __init__(self, folder: Path, row_ids: RowIds):
        stats_file = folder / STATS
        if not stats_file.is_file():
            raise IndexError_(f"no {STATS} in the sharded BM25 folder", path=folder,
                              fix="rebuild the index (cosearch index wiki / build --bm25-backend sharded)")
        self.stats = orjson.loads(stats_file.read_bytes())
        if self.stats["passages"] != len(row_ids):
            raise IndexError_(f"the BM25 shards hold {self.stats['passages']} passages, the doc store "
                              f"{len(row_ids)}", path=folder, fix="rebuild the index")
        self.analyzer = Analyzer(self.stats["stemmer"], self.stats["stopwords"])
        self.terms = _Terms(folder)
        self.shards = [_Shard(folder / shard_name(i), s["start"], s["passages"])
                       for i, s in enumerate(self.stats["shards"])]
        self.row_ids = row_ids
        self._term_ids: dict[str, int | None] = {}

    def term_ids(self, query: str) -> list[int]:
        """The query's known terms as ids, repeats kept (bm25s counts a repeated query term again)."""
        ids = []
        for term in self.analyzer.terms(query):
            if term not in self._term_ids:
                if len(self._term_ids) > _WORD_CACHE:
                    self._term_ids.clear()
                self._term_ids[term] = self.terms.id(term)
            if self._term_ids[term] is not None:
                ids.append(self._term_ids[term])
        return ids

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not queries:
            return []
        k = min(k, len(self.row_ids))
        if k <= 0:
            return [[] for _ in queries]
        query_terms = [self.term_ids(q) for q in queries]
        found: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in queries]
        for shard in self.shards:  # shard outside, queries inside: a shard's pages are read once per batch
            for terms, parts in zip(query_terms, found):
                if terms:
                    parts.append(shard.top(terms, k))
        with paused_gc():  # k hits a query, all acyclic (gcpause.py)
            return [self._merge(parts, k) for parts in found]

    def _merge(self, parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> list[Hit]:
        if not parts:
            return []
        scores = np.concatenate([p[0] for p in parts])
        rows = np.concatenate([p[1] for p in parts])
        best = np.lexsort((rows, -scores))[:k]
        return [Hit(id=i, score=s) for i, s in zip(self.row_ids.take(rows[best]), scores[best].tolist())]
