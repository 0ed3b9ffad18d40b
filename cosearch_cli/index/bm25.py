"""BM25 with bm25s (the default backend; README "BM25 backends" gives the measured reason).

Lucene's BM25 scoring, k1=1.5, b=0.75, English stopwords, Snowball (Porter2) stemming, and the title counted
TITLE_WEIGHT times (a poor man's BM25F): on the shared dev questions this lifts multi-hop gold-passage
recall@10 from 0.802/0.713/0.526 (pyserini's k1=0.9, b=0.4, no stemming, title once) to 0.835/0.717/0.565
(bench/results/retrieval_bm25_settings.md). Tokenising streams in chunks against one growing vocabulary, so
the text of a big corpus is never held in memory (the token ids and the score matrix are).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from cosearch_cli.gcpause import paused_gc
from cosearch_cli.index.docstore import RowIds
from cosearch_cli.records import Hit, Passage

K1 = 1.5
B = 0.75
TITLE_WEIGHT = 4
STOPWORDS = "en"
STEMMER = "english"
_CHUNK = 20_000


def document_text(passage: Passage, title_weight: int = TITLE_WEIGHT) -> str:
    return " ".join([passage.title] * title_weight + [passage.text])


def _stemmer(language: str | None):
    if language is None:
        return None
    import Stemmer

    return Stemmer.Stemmer(language)  # bm25s uses stemWord for documents, stemWords for queries


def import_bm25s():
    """bm25s, with JAX kept on the CPU. Where jax is installed, bm25s runs a jax top-k when it is imported: on a
    GPU node jax would then take 75% of the GPU's memory ahead of torch and vLLM, and where its CUDA plugin finds
    no usable GPU the import raises (seen on an H200 node, bench/results/gpu_check.txt). cosearch uses no jax."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import bm25s

    return bm25s


def build_bm25(passages: Iterable[Passage], folder: Path, *, k1: float = K1, b: float = B,
               stemmer: str | None = STEMMER, stopwords: str | None = STOPWORDS, method: str = "lucene",
               title_weight: int = TITLE_WEIGHT) -> int:
    """Index `passages` (in doc-store row order) into `folder`; returns the number of documents."""
    bm25s = import_bm25s()
    from bm25s.tokenization import Tokenizer

    tokenizer = Tokenizer(stopwords=stopwords or [], stemmer=_stemmer(stemmer))
    ids: list[list[int]] = []
    buffer: list[str] = []
    with paused_gc():  # one token-id list per passage, all acyclic
        for passage in passages:
            buffer.append(document_text(passage, title_weight))
            if len(buffer) == _CHUNK:
                ids.extend(tokenizer.tokenize(buffer, update_vocab=True, return_as="ids", show_progress=False))
                buffer = []
        if buffer:
            ids.extend(tokenizer.tokenize(buffer, update_vocab=True, return_as="ids", show_progress=False))
    model = bm25s.BM25(k1=k1, b=b, method=method)
    model.index(bm25s.tokenization.Tokenized(ids=ids, vocab=tokenizer.get_vocab_dict()), show_progress=False)
    folder.mkdir(parents=True, exist_ok=True)
    model.save(str(folder), show_progress=False)
    return len(ids)


def tokenize_queries(queries: Sequence[str], stemmer: str | None = STEMMER,
                     stopwords: str | None = STOPWORDS) -> list[list[str]]:
    return import_bm25s().tokenize(list(queries), stopwords=stopwords or [], stemmer=_stemmer(stemmer),
                                   return_ids=False, show_progress=False)


class BM25Retriever:
    """Batched top-k over a saved bm25s index; rows map to passage ids through `row_ids`."""

    name = "bm25"

    def __init__(self, folder: Path, row_ids: RowIds, *, stemmer: str | None = STEMMER,
                 stopwords: str | None = STOPWORDS, mmap: bool = False):
        self.stemmer, self.stopwords = stemmer, stopwords
        self.model = import_bm25s().BM25.load(str(folder), mmap=mmap, show_progress=False, verbosity=0)
        self.row_ids = row_ids
        self.n_docs = len(row_ids)

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Each query's k best passages by bm25s's scores (`get_scores_from_ids`, the same float32 sums as
        `BM25.retrieve`), best first, equal scores by row; passages no query term matches are no hits."""
        if not queries:
            return []
        k = min(k, self.n_docs)
        if k <= 0:
            return [[] for _ in queries]
        with paused_gc():  # k hits a query, all acyclic (gcpause.py gives the measured cost)
            hits = []
            for tokens in tokenize_queries(queries, self.stemmer, self.stopwords):
                term_ids = self.model.get_tokens_ids(tokens)  # leaves out terms the corpus lacks
                if not term_ids:
                    hits.append([])
                    continue
                scores = self.model.get_scores_from_ids(term_ids)
                rows = top_rows(scores, k)
                hits.append([Hit(id=i, score=s) for i, s in zip(self.row_ids.take(rows), scores[rows].tolist())])
            return hits


def top_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """The rows of the k highest positive `scores`, highest first, equal scores in row order (the sharded
    backend's order). Only matched rows are partitioned: bm25s's `np.argpartition(scores, -k)` over the whole
    vector, most of it zeros, took 2.6 of a search's ~3 ms on the shared corpus; searches are 14x faster this
    way (bench/results/index_speed_bm25.md)."""
    rows = np.flatnonzero(scores > 0)
    if len(rows) > k:
        values = scores[rows]
        kth = np.partition(values, len(values) - k)[len(values) - k]  # the k-th highest score
        above = rows[values > kth]
        rows = np.concatenate([above, rows[values == kth][:k - len(above)]])
    return rows[np.lexsort((rows, -scores[rows]))]
