"""Typed errors. Library code raises these; the CLI prints one line and exits with the class's code.

Exit codes (documented in README.md and `cosearch --help`):
  1  unexpected internal error (a bug: please report it)
  2  command-line usage error (unknown option, missing argument) - Typer's own code
  3  bad input data: malformed JSONL, missing or mistyped fields, old schema, empty corpus
  4  impossible option or config values
  5  model problem: unknown model path, vocabulary mismatch
  6  index problem: missing index folder, index built with another encoder
  7  nothing to do: no trainable groups in the batch
  8  output exists and --overwrite was not given
"""

from __future__ import annotations

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
