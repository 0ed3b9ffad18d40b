"""Retrieval indexes: a doc store plus BM25 (bm25s) and/or dense (FAISS) retrievers in one folder.

    build_index(passages, folder, bm25=True, dense="minilm")   -> writes the folder atomically
    index = open_index(folder); index.docs.get(ids); index.retriever("bm25").search(queries, k)
    open_index("http://host:port") answers the same from a `cosearch serve` server (remote.py)
"""

from cosearch_cli.index.build import Index, build_index, index_location, open_index
from cosearch_cli.index.corpus import Corpus, passage_from_row
from cosearch_cli.index.docstore import DocStore

__all__ = ["Corpus", "DocStore", "Index", "build_index", "index_location", "open_index", "passage_from_row"]
