"""The retrieval protocol every stage talks to; BM25 and dense indexes implement it (see cosearch_cli/index/).

A stage never knows which retriever it has: it asks `search` for batches of queries and the doc store for
passages by id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from cosearch_cli.records import Hit, Passage


class Retriever(Protocol):
    """Top-k search over a fixed corpus."""

    name: str  # "bm25" | "dense" ...

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """For each query, its k best passages, best first."""
        ...


class DocStore(Protocol):
    """Random access to passages by id."""

    def get(self, ids: Sequence[str]) -> list[Passage]:
        ...

    def __len__(self) -> int:
        ...
