"""Reading and writing the artifacts stages exchange.

- JSONL (orjson) or Parquet (polars), chosen by suffix; `-` is stdin/stdout (always JSONL).
- Reading streams line by line and hashes the bytes as it goes, so a manifest can name its inputs.
- Writing goes to a temporary file beside the target and is renamed into place only when the stage
  finished, so a failed stage leaves no half-written artifact and the previous file stays intact.
- Every file artifact gets a sidecar `<name>.manifest.json`. A stream on stdout carries its manifest as the
  last line, `{"kind": "manifest", ...}`; readers collect such lines as upstream provenance and never
  hand them to a stage. A stage's stream that ends without one was cut short (its upstream failed).
- Temporary files and folders are named `.<name>.tmp-<pid>`: a process removes its own when it fails or is
  interrupted, and the next writer in that folder removes those whose process is gone (killed with -9).
- Parquet cannot hold every nested shape (polars refuses a struct without fields, e.g. `scores: {}`), so
  nested columns are stored as JSON text and named in the file's metadata; readers decode them back.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import hashlib
import importlib.metadata
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from cosearch_cli import __version__
from cosearch_cli.errors import InputError, OutputExists, RecordError, UsageError

STDIO = "-"
MANIFEST_KIND = "manifest"
JSON_COLUMNS_KEY = "cosearch.json_columns"  # Parquet metadata: the columns stored as JSON text
_TEMPORARY = re.compile(r"^\..+\.(?:tmp|old)-(\d+)(?:\.[A-Za-z0-9]+)?$")
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
        out.append(str(input_file(p)))
    return out


def input_file(path: str | Path, what: str = "file") -> Path:
    """`path` as an existing file, or a one-line error saying what is there instead."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"is a folder, not a {what}", path=path, fix=f"pass the {what} inside it")
    if not path.is_file():
        raise InputError(f"{what} not found", path=path, fix="check the path, or use - for stdin")
    return path


@dataclass
class Row:
    """One parsed input line with where it came from (for error messages)."""

    data: dict
    path: str
    line: int


@dataclass
class Reader:
    """Streams dicts from JSONL/Parquet inputs, hashing bytes and collecting upstream manifests.

    `stage_stream`: stdin carries another stage's output, which ends with its manifest line; a stream without
    one was cut short (the upstream stage failed) and is refused, or with `allow_partial` read and counted in
    `partial`, so the output's manifest can say so."""

    paths: list[str]
    hashes: dict[str, str] = field(default_factory=dict)
    upstream: list[dict] = field(default_factory=list)
    stage_stream: bool = False
    allow_partial: bool = False
    partial: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, paths: str | Path | Iterable[str | Path], *, stage_stream: bool = False,
             allow_partial: bool = False) -> "Reader":
        return cls(expand_inputs(paths), stage_stream=stage_stream, allow_partial=allow_partial)

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
        ended_with_manifest = False
        try:
            for lineno, raw in enumerate(stream, start=1):
                digest.update(raw)
                if not raw.strip():
                    continue
                ended_with_manifest = False
                try:
                    data = orjson.loads(raw)
                except orjson.JSONDecodeError as exc:
                    non_finite = _non_finite_field(raw)
                    if non_finite:
                        raise RecordError(f"field {non_finite} is not a finite number", path=name, line=lineno,
                                          fix="NaN and infinity are not data: regenerate this file") from None
                    raise RecordError(f"not valid JSON ({exc.args[0].split(':')[0]})", path=name, line=lineno,
                                      fix="each line must be one JSON object (JSONL)") from None
                if not isinstance(data, dict):
                    raise RecordError(f"expected a JSON object, got {type(data).__name__}", path=name,
                                      line=lineno, fix="each line must be one JSON object (JSONL)")
                if data.get("kind") == MANIFEST_KIND:
                    self.upstream.append(data)
                    ended_with_manifest = True
                    continue
                yield Row(data, name, lineno)
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()
        if path == STDIO and self.stage_stream and not ended_with_manifest:
            if not self.allow_partial:
                raise InputError("the input stream ended without a manifest line: the upstream stage failed or "
                                 "was stopped, so this input is incomplete", path=name,
                                 fix="fix and rerun the upstream stage (pass a file instead of a pipe to read one "
                                     "as it is, or --allow-partial to accept a cut stream)")
            self.partial.append(name)
        self.hashes[name] = digest.hexdigest()
        if path != STDIO:
            self._add_sidecar(path)

    def _parquet_rows(self, path: str) -> Iterator[Row]:
        import polars as pl

        self.hashes[path] = file_sha256(path)
        try:
            frame = pl.read_parquet(path)
            json_columns = pl.read_parquet_metadata(path).get(JSON_COLUMNS_KEY)
        except Exception as exc:  # polars raises several unrelated types for a bad file
            raise InputError(f"not a readable Parquet file ({type(exc).__name__})", path=path,
                             fix="regenerate it, or pass a .jsonl file") from None
        json_columns = [c for c in orjson.loads(json_columns) if c in frame.columns] if json_columns else []
        for index, data in enumerate(frame.iter_rows(named=True), start=1):
            for column in json_columns:
                if data[column] is not None:
                    data[column] = _json_cell(data[column], path, index, column)
            non_finite = first_non_finite(data)  # Parquet, unlike JSON, holds NaN and infinity
            if non_finite:
                raise RecordError(f"field {non_finite} is not a finite number", path=path, line=index,
                                  fix="NaN and infinity are not data: regenerate this file")
            yield Row(data, path, index)
        self._add_sidecar(path)

    def _add_sidecar(self, path: str) -> None:
        """A file's `<name>.manifest.json` is its provenance, as a streamed manifest line is a pipe's."""
        sidecar = manifest_path(path)
        if sidecar.is_file():
            self.upstream.append(orjson.loads(sidecar.read_bytes()))


def _json_cell(text: str, path: str, row: int, column: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        import json

        try:
            return json.loads(text)  # NaN and Infinity: the caller names the field
        except ValueError:
            raise RecordError(f"column {column!r} is not valid JSON", path=path, line=row,
                              fix="regenerate this file with the cosearch stage that makes it") from None


def _non_finite_field(raw: bytes) -> str | None:
    """Where a line that orjson refused holds NaN or infinity (Python's json writes them), e.g.
    'trajectories[0].logprobs[3]'; None when the line is not JSON for another reason."""
    import json

    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return first_non_finite(data)


def first_non_finite(value: Any, where: str = "") -> str | None:
    """The path of the first NaN or infinite float inside nested dicts and lists, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{where or 'value'} ({value})"
    if isinstance(value, dict):
        items = ((f"{where}.{key}" if where else str(key), item) for key, item in value.items())
    elif isinstance(value, (list, tuple)):
        if all(isinstance(item, (int, float)) for item in value) and math.isfinite(sum(value)):
            return None  # the common case, a long list of finite numbers, in one pass
        items = ((f"{where}[{i}]", item) for i, item in enumerate(value))
    else:
        return None
    for path, item in items:
        found = first_non_finite(item, path)
        if found:
            return found
    return None


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


def temporary_path(target: str | Path, suffix: str = "") -> Path:
    """Where a write to `target` goes before its rename: hidden, beside it, named with this process's id."""
    target = Path(target)
    return target.with_name(f".{target.name}.tmp-{os.getpid()}{suffix}")


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def sweep_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporary files and folders in `folder` whose writing process no longer runs (killed with
    -9 or by the machine going down); returns what was removed. Live processes' temporaries are kept."""
    folder = Path(folder)
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.match(entry.name)
        if match and int(match.group(1)) != os.getpid() and not _alive(int(match.group(1))):
            remove_path(entry)
            removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write through a temporary beside `path` and rename; a failed or interrupted write leaves no temporary."""
    check_output_file(path)
    path = Path(path)
    sweep_temporaries(path.parent)
    tmp = temporary_path(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def mark_partial(manifest: dict, readers: Iterable["Reader"]) -> dict:
    """Record in `manifest` which inputs were cut-short streams read with --allow-partial."""
    cut = [name for reader in readers for name in reader.partial]
    if cut:
        manifest["partial"] = {"inputs": cut, "reason": "the input stream ended without its manifest line"}
    return manifest


def write_json_atomic(path: str | Path, obj: Any) -> None:
    write_bytes_atomic(path, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def check_output_file(path: str | Path) -> None:
    """Refuse an output path that names a folder (-o DIR): a usage error, before any work is done."""
    if str(path) != STDIO and Path(path).is_dir():
        raise UsageError("is a folder; -o names the file to write", path=path,
                         fix="pass a file path such as OUT/records.jsonl or .parquet, or - for stdout")


@contextmanager
def output_lock(target: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on the output `target` (a folder a run writes) for the whole block, so a second
    cosearch process writing the same target stops at once instead of replacing the first one's work.

    The lock is `flock` on `.<name>.lock` beside the target (the target itself may be renamed into place);
    the kernel releases it when the process dies, and the lock file is removed when the block ends."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock = target.with_name(f".{target.name}.lock")
    while True:
        handle = open(lock, "a+b")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            handle.seek(0)
            holder = handle.read().decode(errors="replace").strip() or "?"
            handle.close()
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise OutputExists(f"{target} is being written by another cosearch process (pid {holder})",
                               fix="wait for it to finish, or choose another output") from None
        try:
            if os.fstat(handle.fileno()).st_ino == os.stat(lock).st_ino:
                break  # still the lock file (not one a finishing holder just removed)
        except FileNotFoundError:
            pass
        handle.close()
    try:
        handle.truncate(0)
        handle.write(str(os.getpid()).encode())
        handle.flush()
        yield
    finally:
        lock.unlink(missing_ok=True)
        handle.close()


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
        check_output_file(self.path)
        if self.path == STDIO:
            self._handle = sys.stdout.buffer
        elif not is_parquet(self.path):
            target = Path(self.path)
            target.parent.mkdir(parents=True, exist_ok=True)
            sweep_temporaries(target.parent)
            self._tmp = temporary_path(target)
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
        sweep_temporaries(target.parent)
        rows = [r if isinstance(r, dict) else orjson.loads(orjson.dumps(r)) for r in self._rows]
        nested = sorted({key for row in rows for key, value in row.items() if _is_nested(value)})
        for row in rows:
            for key in nested:
                if key in row:
                    row[key] = orjson.dumps(row[key]).decode()
        tmp = temporary_path(target)
        try:
            pl.DataFrame(rows, infer_schema_length=None).write_parquet(
                tmp, metadata={JSON_COLUMNS_KEY: orjson.dumps(nested).decode()} if nested else None)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)


def _is_nested(value: Any) -> bool:
    """A dict, or a list holding dicts or lists: shapes Parquet stores only as structs (see the module doc)."""
    if isinstance(value, dict):
        return True
    return isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value)
