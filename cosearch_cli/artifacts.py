"""Reading and writing the artifacts stages exchange.

- JSONL (orjson) or Parquet (polars), chosen by suffix; `-` is stdin/stdout (always JSONL).
- Reading streams line by line and hashes the bytes as it goes, so a manifest can name its inputs.
- Writing goes to a temporary file beside the target and is renamed into place only when the stage
  finished, so a failed stage leaves no half-written artifact and the previous file stays intact.
- Every file artifact gets a sidecar `<name>.manifest.json`. A stream on stdout carries its manifest as the
  last line, `{"kind": "manifest", ...}`; readers collect such lines as upstream provenance and never
  hand them to a stage.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.metadata
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from cosearch_cli import __version__
from cosearch_cli.errors import InputError, RecordError

STDIO = "-"
MANIFEST_KIND = "manifest"
_PACKAGES = ("torch", "transformers", "polars", "orjson", "numpy", "bm25s", "faiss-cpu", "peft", "vllm")
_DUMP_OPTIONS = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def dumps(obj: Any) -> bytes:
    """One JSONL line (with its newline) for a dict or dataclass."""
    return orjson.dumps(obj, option=_DUMP_OPTIONS)


def is_parquet(path: str | Path) -> bool:
    return str(path).endswith(".parquet")


def expand_inputs(paths: str | Path | Iterable[str | Path]) -> list[str]:
    """Turn a path, a glob or a list of them into concrete inputs, keeping `-` as stdin."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    out: list[str] = []
    for p in paths:
        p = str(p)
        if p == STDIO:
            out.append(p)
            continue
        if any(ch in p for ch in "*?["):
            matches = sorted(glob.glob(p))
            if not matches:
                raise InputError(f"no file matches {p!r}", fix="check the glob pattern")
            out.extend(matches)
            continue
        if not Path(p).is_file():
            raise InputError("file not found", path=p, fix="check the path, or use - for stdin")
        out.append(p)
    return out


@dataclass
class Row:
    """One parsed input line with where it came from (for error messages)."""

    data: dict
    path: str
    line: int


@dataclass
class Reader:
    """Streams dicts from JSONL/Parquet inputs, hashing bytes and collecting upstream manifests."""

    paths: list[str]
    hashes: dict[str, str] = field(default_factory=dict)
    upstream: list[dict] = field(default_factory=list)

    @classmethod
    def open(cls, paths: str | Path | Iterable[str | Path]) -> "Reader":
        return cls(expand_inputs(paths))

    def rows(self) -> Iterator[Row]:
        for path in self.paths:
            if is_parquet(path):
                yield from self._parquet_rows(path)
            else:
                yield from self._jsonl_rows(path)

    def _jsonl_rows(self, path: str) -> Iterator[Row]:
        digest = hashlib.sha256()
        name = "<stdin>" if path == STDIO else path
        stream = sys.stdin.buffer if path == STDIO else open(path, "rb")
        try:
            for lineno, raw in enumerate(stream, start=1):
                digest.update(raw)
                if not raw.strip():
                    continue
                try:
                    data = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    raise RecordError(f"not valid JSON ({exc.args[0].split(':')[0]})", path=name, line=lineno,
                                      fix="each line must be one JSON object (JSONL)") from None
                if not isinstance(data, dict):
                    raise RecordError(f"expected a JSON object, got {type(data).__name__}", path=name,
                                      line=lineno, fix="each line must be one JSON object (JSONL)")
                if data.get("kind") == MANIFEST_KIND:
                    self.upstream.append(data)
                    continue
                yield Row(data, name, lineno)
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()
        self.hashes[name] = digest.hexdigest()
        if path != STDIO:
            self._add_sidecar(path)

    def _parquet_rows(self, path: str) -> Iterator[Row]:
        import polars as pl

        self.hashes[path] = file_sha256(path)
        try:
            frame = pl.read_parquet(path)
        except Exception as exc:  # polars raises several unrelated types for a bad file
            raise InputError(f"not a readable Parquet file ({type(exc).__name__})", path=path,
                             fix="regenerate it, or pass a .jsonl file") from None
        for index, data in enumerate(frame.iter_rows(named=True), start=1):
            yield Row(data, path, index)
        self._add_sidecar(path)

    def _add_sidecar(self, path: str) -> None:
        """A file's `<name>.manifest.json` is its provenance, as a streamed manifest line is a pipe's."""
        sidecar = manifest_path(path)
        if sidecar.is_file():
            self.upstream.append(orjson.loads(sidecar.read_bytes()))


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def manifest_path(path: str | Path) -> Path:
    path = Path(path)
    stem = path.name
    for suffix in (".jsonl", ".parquet", ".json"):
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
            break
    return path.with_name(f"{stem}.manifest.json")


def package_versions() -> dict[str, str]:
    versions = {"cosearch": __version__, "python": sys.version.split()[0]}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def make_manifest(stage: str, options: dict, *, inputs: dict[str, str] | None = None,
                  seed: int | None = None, upstream: list[dict] | None = None) -> dict:
    """How an artifact was made: enough to rerun it and to tell two artifacts apart."""
    return {
        "kind": MANIFEST_KIND,
        "stage": stage,
        "options": options,
        "inputs": inputs or {},
        "seed": seed,
        "packages": package_versions(),
        "upstream": upstream or [],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_json_atomic(path: str | Path, obj: Any) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    os.replace(tmp, path)


class Writer:
    """Context manager writing records atomically; set `.manifest` before the block ends.

    On an exception inside the block the temporary file is removed and the target is untouched.
    """

    def __init__(self, path: str | Path, *, manifest: dict | None = None):
        self.path = str(path)
        self.manifest = manifest
        self.count = 0
        self._rows: list[Any] = []
        self._handle = None
        self._tmp: Path | None = None

    def __enter__(self) -> "Writer":
        if self.path == STDIO:
            self._handle = sys.stdout.buffer
        elif not is_parquet(self.path):
            target = Path(self.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            self._tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            self._handle = open(self._tmp, "wb")
        return self

    def write(self, record: Any) -> None:
        self.count += 1
        if is_parquet(self.path):
            self._rows.append(record)
            return
        self._handle.write(dumps(record))
        if self.path == STDIO:
            self._handle.flush()

    def write_all(self, records: Iterable[Any]) -> None:
        for record in records:
            self.write(record)

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._abort()
            return
        if self.path == STDIO:
            if self.manifest is not None:
                self._handle.write(dumps(self.manifest))
            self._handle.flush()
            return
        if is_parquet(self.path):
            self._write_parquet()
        else:
            self._handle.close()
            os.replace(self._tmp, self.path)
        if self.manifest is not None:
            write_json_atomic(manifest_path(self.path), self.manifest)

    def _abort(self) -> None:
        if self._handle is not None and self.path != STDIO:
            self._handle.close()
        if self._tmp is not None and self._tmp.exists():
            self._tmp.unlink()

    def _write_parquet(self) -> None:
        import polars as pl

        target = Path(self.path)
        target.parent.mkdir(parents=True, exist_ok=True)
        rows = [r if isinstance(r, dict) else orjson.loads(orjson.dumps(r)) for r in self._rows]
        tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
        try:
            pl.DataFrame(rows, infer_schema_length=None).write_parquet(tmp)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                tmp.unlink()
