"""Reading passage corpora: `{"id","title","text"}` or the Search-R1/FlashRAG form `{"id","contents"}`.

`contents` is `'"' + title + '"\n' + text`; we split it back so every index stores title and text apart.
Rows stream one at a time, so a 21M-passage wiki-18 dump never sits in memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from cosearch_cli.artifacts import Reader
from cosearch_cli.errors import RecordError
from cosearch_cli.records import Passage

_FIX = 'each line needs "id" plus "title" and "text", or "id" plus "contents" (\'"Title"\\ntext\')'


def passage_from_row(data: dict, path: str, line: int) -> Passage:
    """One corpus line as a Passage; ids may be numbers in some dumps and become strings."""
    pid = data.get("id")
    if pid is None or isinstance(pid, (bool, dict, list)) or pid == "":
        raise RecordError("missing field 'id'" if pid is None else f"bad passage id {pid!r}", path=path,
                          line=line, fix=_FIX)
    if "contents" in data and "text" not in data:
        contents = data["contents"]
        if not isinstance(contents, str):
            raise RecordError(f"field 'contents' should be a string, got {type(contents).__name__}",
                              path=path, line=line, fix=_FIX)
        title, text = split_contents(contents)
        return Passage(id=str(pid), title=title, text=text)
    for name in ("title", "text"):
        if name not in data:
            raise RecordError(f"missing field {name!r}", path=path, line=line, fix=_FIX)
        if not isinstance(data[name], str):
            raise RecordError(f"field {name!r} should be a string, got {type(data[name]).__name__}",
                              path=path, line=line, fix=_FIX)
    return Passage(id=str(pid), title=data["title"], text=data["text"])


def split_contents(contents: str) -> tuple[str, str]:
    """'"Title"\\ntext' -> (Title, text); a contents without a title line is all text."""
    head, sep, text = contents.partition("\n")
    if not sep:
        return "", contents
    if len(head) >= 2 and head.startswith('"') and head.endswith('"'):
        head = head[1:-1]
    return head, text


class Corpus:
    """A streamed corpus: iterate for Passages; `.sha256` (over the passages, not the bytes) and `.count`
    are known once iteration finished, `.where` maps the last passages' ids to (file, line) for messages."""

    def __init__(self, paths: str | Iterable[str]):
        self.reader = Reader.open(paths)
        self.sha256: str | None = None
        self.count = 0

    def __iter__(self) -> Iterator[Passage]:
        digest = hashlib.sha256()
        count = 0
        for row in self.reader.rows():
            passage = passage_from_row(row.data, row.path, row.line)
            self.last = (row.path, row.line)
            digest.update(passage_key(passage))
            count += 1
            yield passage
        self.sha256 = digest.hexdigest()
        self.count = count

    @property
    def file_hashes(self) -> dict[str, str]:
        return self.reader.hashes


def passage_key(passage: Passage) -> bytes:
    """The bytes a corpus hash is made of: independent of the file form, JSON spacing and file split."""
    return f"{passage.id}\t{passage.title}\t{passage.text}\n".encode()


def corpus_sha256(passages: Iterable[Passage]) -> str:
    digest = hashlib.sha256()
    for passage in passages:
        digest.update(passage_key(passage))
    return digest.hexdigest()
