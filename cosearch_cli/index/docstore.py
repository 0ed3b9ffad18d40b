"""The doc store: passages by id with random access, for any corpus size.

Layout inside an index folder:
  passages.jsonl     one {"id","title","text"} per row, in corpus order (row = position in the BM25/FAISS index)
  offsets.npy        uint64 byte offset of every row, plus the file size (n + 1 entries)
  ids.npy            row -> id (bytes, fixed width)
  ids_sorted.npy     ids in sorted order, and rows_sorted.npy their rows: lookup by binary search, so opening
  rows_sorted.npy    a 21M-passage store needs no Python dict (both arrays are memory-mapped)
"""

from __future__ import annotations

import mmap
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import orjson

from cosearch_cli.errors import IndexError_, RecordError
from cosearch_cli.records import Passage

PASSAGES = "passages.jsonl"
_ID_CHUNK = 1_000_000
# What reading a missing, truncated or garbled index file raises (numpy, faiss, bm25s, orjson).
DAMAGED = (OSError, ValueError, EOFError, RuntimeError)


def damaged_index(path: Path | str, exc: BaseException | str) -> IndexError_:
    """The one-line error for an index file that is missing or cannot be read: name it, say to rebuild."""
    if isinstance(exc, str):
        detail = exc
    elif isinstance(exc, FileNotFoundError):
        detail, path = "is missing", exc.filename or path
    else:
        detail = f"is damaged ({type(exc).__name__})"
    return IndexError_(f"index file {detail}", path=path,
                       fix="rebuild the index (`cosearch index build/wiki/fixture ... --overwrite`)")


class DocStoreWriter:
    """Appends passages in row order; `close()` writes the id tables and refuses duplicate ids."""

    def __init__(self, folder: Path):
        self.folder = folder
        self._handle = open(folder / PASSAGES, "wb")
        self._offsets = array("Q", [0])  # 8 bytes a passage, not a Python int each (wiki-18: 170 MB)
        self._end = 0
        self._id_chunks: list[np.ndarray] = []
        self._ids: list[bytes] = []
        self.count = 0
        self.where: dict[int, tuple[str, int]] = {}

    def add(self, passage: Passage) -> None:
        line = orjson.dumps({"id": passage.id, "title": passage.title, "text": passage.text}) + b"\n"
        self._handle.write(line)
        self._end += len(line)
        self._offsets.append(self._end)
        self._ids.append(passage.id.encode())
        self.count += 1
        if len(self._ids) == _ID_CHUNK:
            self._id_chunks.append(np.array(self._ids, dtype=bytes))
            self._ids = []

    def close(self) -> np.ndarray:
        """Finish the files; returns the duplicate id rows (empty when all ids are unique)."""
        self._handle.close()
        if self._ids or not self._id_chunks:
            self._id_chunks.append(np.array(self._ids, dtype=bytes) if self._ids else np.zeros(0, dtype="S1"))
        ids = np.concatenate(self._id_chunks) if len(self._id_chunks) > 1 else self._id_chunks[0]
        order = np.argsort(ids, kind="stable")
        ids_sorted = ids[order]
        duplicates = np.flatnonzero(ids_sorted[1:] == ids_sorted[:-1])
        np.save(self.folder / "offsets.npy", np.frombuffer(self._offsets, dtype=np.uint64))
        np.save(self.folder / "ids.npy", ids)
        np.save(self.folder / "ids_sorted.npy", ids_sorted)
        np.save(self.folder / "rows_sorted.npy", order.astype(np.int64))
        return order[duplicates + 1]


class DocStore:
    """Random access to the passages of an index folder: `get(ids)`, `row(i)`, `len`, iteration."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.offsets = self._table("offsets.npy")
        self.ids = self._table("ids.npy")
        self._ids_sorted = self._table("ids_sorted.npy")
        self._rows_sorted = self._table("rows_sorted.npy")
        n = len(self.offsets) - 1
        for name, table in (("ids.npy", self.ids), ("ids_sorted.npy", self._ids_sorted),
                            ("rows_sorted.npy", self._rows_sorted)):
            if len(table) != n:
                raise damaged_index(self.folder / name, f"holds {len(table)} rows, offsets.npy {n}")
        try:
            self._file = open(self.folder / PASSAGES, "rb")
        except OSError as exc:
            raise damaged_index(self.folder / PASSAGES, exc) from None
        size = int(self.offsets[-1]) if n >= 0 else 0
        actual = self.folder.joinpath(PASSAGES).stat().st_size
        if actual != size:
            raise damaged_index(self.folder / PASSAGES, f"has {actual:,} bytes, offsets.npy expects {size:,}")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def _table(self, name: str) -> np.ndarray:
        try:
            return np.load(self.folder / name, mmap_mode="r")
        except DAMAGED as exc:
            raise damaged_index(self.folder / name, exc) from None

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def row(self, index: int) -> Passage:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        return Passage(**orjson.loads(self._map[start:end]))

    def row_id(self, index: int) -> str:
        return self.ids[index].decode()

    def rows_of(self, ids: Sequence[str]) -> list[int]:
        keys = np.array([i.encode() for i in ids], dtype=bytes) if ids else np.zeros(0, dtype="S1")
        pos = np.searchsorted(self._ids_sorted, keys)
        rows = []
        for key, p in zip(keys, pos):
            if p >= len(self._ids_sorted) or self._ids_sorted[p] != key:
                raise IndexError_(f"passage id {key.decode()!r} is not in this index", path=self.folder,
                                  fix="use ids from this index's search results")
            rows.append(int(self._rows_sorted[p]))
        return rows

    def get(self, ids: Sequence[str]) -> list[Passage]:
        return [self.row(r) for r in self.rows_of(ids)]

    def __contains__(self, pid: str) -> bool:
        try:
            self.rows_of([pid])
        except IndexError_:
            return False
        return True

    def __iter__(self) -> Iterator[Passage]:
        with open(self.folder / PASSAGES, "rb") as handle:
            for raw in handle:
                yield Passage(**orjson.loads(raw))

    def row_ids(self) -> "RowIds":
        """Row number -> id, decoded lazily (what retrievers map their row numbers through)."""
        return RowIds(self.ids)


class RowIds(Sequence):
    """A read-only view of the id table that decodes one id at a time (no 21M-string list in memory)."""

    def __init__(self, ids: np.ndarray):
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, index):
        return self._ids[index].decode()

    def take(self, rows) -> list[str]:
        """Ids of many rows at once (one numpy gather instead of a lookup per hit)."""
        return [i.decode() for i in self._ids[np.asarray(rows, dtype=np.int64)].tolist()]


def duplicate_error(pid: str, first: tuple[str, int] | None, second: tuple[str, int] | None) -> RecordError:
    where = f" (first at {first[0]}:{first[1]})" if first else ""
    return RecordError(f"duplicate passage id {pid!r}{where}", path=second[0] if second else None,
                       line=second[1] if second else None,
                       fix="passage ids must be unique across all corpus files; drop or rename the duplicate")
