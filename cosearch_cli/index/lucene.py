"""Optional BM25 backend: pyserini 0.25 (Lucene 9, Java 17), for cross-checking bm25s against the field's
reference. Install with `pip install -e .[pyserini]`; a JDK 17 must be on PATH or in JAVA_HOME.

Same documents as bm25.py (title counted TITLE_WEIGHT times) and the same k1/b; Lucene's own analyzer does
the tokenising (Porter stemming, English stopwords). Measured against bm25s in README "BM25 backends".
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import orjson

from cosearch_cli.errors import ConfigError
from cosearch_cli.index.bm25 import B, K1, TITLE_WEIGHT
from cosearch_cli.records import Hit, Passage

_FIX = "pip install -e '.[pyserini]' (needs Java 17), or use the default bm25s backend"


def _check_installed() -> None:
    import importlib.util

    if importlib.util.find_spec("pyserini") is None:
        raise ConfigError("the pyserini BM25 backend is not installed", fix=_FIX)


def build_lucene(passages: Iterable[Passage], folder: Path, *, title_weight: int = TITLE_WEIGHT) -> int:
    """Write the passages as a JsonCollection and run pyserini's Lucene indexer (one thread: reproducible)."""
    _check_installed()
    docs = folder / "collection"
    docs.mkdir(parents=True)
    count = 0
    with open(docs / "docs.jsonl", "wb") as handle:
        for passage in passages:
            contents = " ".join([passage.title] * title_weight) + "\n" + passage.text
            handle.write(orjson.dumps({"id": passage.id, "contents": contents}) + b"\n")
            count += 1
    done = subprocess.run([sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
                           "--input", str(docs), "--index", str(folder / "index"), "--generator",
                           "DefaultLuceneDocumentGenerator", "--threads", "1"], capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ConfigError(f"pyserini indexing failed: {tail[0]}", fix=_FIX)
    (docs / "docs.jsonl").unlink()
    docs.rmdir()
    return count


class LuceneRetriever:
    """Batched top-k with pyserini's LuceneSearcher."""

    name = "bm25"

    def __init__(self, folder: Path, *, k1: float = K1, b: float = B, threads: int = 1):
        _check_installed()
        from pyserini.search.lucene import LuceneSearcher

        self.searcher = LuceneSearcher(str(folder / "index"))
        self.searcher.set_bm25(k1, b)
        self.threads = threads

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        qids = [str(i) for i in range(len(queries))]
        results = self.searcher.batch_search(list(queries), qids, k=k, threads=self.threads)
        return [[Hit(id=h.docid, score=float(h.score)) for h in results[q]] for q in qids]
