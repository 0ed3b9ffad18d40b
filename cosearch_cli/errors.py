"""Typed errors. Library code raises these; the CLI prints one line and exits with the class's code.

Exit codes (documented in README.md and `cosearch --help`):
  1  unexpected internal error (a bug: please report it)
  2  command-line usage error (unknown option, missing argument; Typer's own code), or -o naming a folder
  3  bad input data: malformed JSONL, missing or mistyped fields, old schema, empty corpus
  4  impossible option or config values
  5  model problem: unknown model path, vocabulary mismatch
  6  index problem: missing index folder, index built with another encoder
  7  nothing to do: no trainable groups in the batch
  8  output exists and --overwrite was not given, or another cosearch process is writing it
  9  cannot write: disk full, no permission, read-only file system
"""

from __future__ import annotations

import errno
import re
from pathlib import Path


class CosearchError(Exception):
    """Base error: a message, where it happened, and how to fix it."""

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None, path: str | Path | None = None,
                 line: int | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        self.path = str(path) if path is not None else None
        self.line = line

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = f"{self.path}:{self.line}: " if self.line is not None else f"{self.path}: "
        text = f"{where}{self.message}"
        if self.fix:
            text += f" - {self.fix}"
        return text


class UsageError(CosearchError):
    """A command line that names the wrong kind of thing (e.g. a folder where a file is written)."""

    exit_code = 2


class InputError(CosearchError):
    """Bad input data (files, records)."""

    exit_code = 3


class RecordError(InputError):
    """A record that does not parse or lacks a field the stage needs."""


class ConfigError(CosearchError):
    """Option or config values that cannot work together."""

    exit_code = 4


class ModelError(CosearchError):
    """A model that cannot be found or does not fit the data."""

    exit_code = 5


class IndexError_(CosearchError):
    """A retrieval index that is missing or incompatible (named with _ to not shadow the builtin)."""

    exit_code = 6


class NothingToDo(CosearchError):
    """The input holds no work for this stage (e.g. no trainable groups)."""

    exit_code = 7


class OutputExists(CosearchError):
    """Refusing to overwrite an existing output."""

    exit_code = 8


class StorageError(CosearchError):
    """The file system refused a write (disk full, quota, permission, read-only)."""

    exit_code = 9


_STORAGE_ERRNOS = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space or raise the quota",
                   errno.EACCES: "choose a folder you can write to", errno.EPERM: "choose a folder you can write to",
                   errno.EROFS: "choose a writable folder"}


def storage_error(exc: BaseException) -> StorageError | None:
    """The one-line error for a write the file system refused, or None when `exc` is something else.

    Besides OSError this recognises libraries that wrap the OS error in their own exception (safetensors
    raises "... No space left on device (os error 28)" when a checkpoint does not fit)."""
    for cause in (exc, exc.__cause__, exc.__context__):
        if isinstance(cause, OSError) and cause.errno in _STORAGE_ERRNOS:
            reason = cause.strerror or errno.errorcode.get(cause.errno, "write refused")
            return _storage(reason, cause.errno, cause.filename)
    text = str(exc)
    # numpy's tofile/np.save report a short write without an errno: "42 requested and 0 written"
    short_write = isinstance(exc, OSError) and exc.errno is None and re.search(r"\d+ requested and \d+ written", text)
    if "No space left on device" in text or "os error 28" in text or short_write:
        return _storage("no space left on device", errno.ENOSPC, None)
    return None


def _storage(reason: str, code: int, path: str | None) -> StorageError:
    return StorageError(reason, path=path, fix=f"{_STORAGE_ERRNOS[code]} (or pass another output path), then run "
                                               "the command again: nothing half-written was kept")
