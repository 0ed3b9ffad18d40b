"""Options and helpers shared by every command, declared once so every command spells a flag the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from cosearch_cli.errors import OutputExists

stderr = Console(stderr=True)

Seed = Annotated[int, typer.Option(help="Random seed; the same seed and inputs give the same artifact.")]
Output = Annotated[str, typer.Option("--output", "-o",
                                     help="Where to write: a .jsonl or .parquet path, or - for stdout.")]
Inputs = Annotated[list[str], typer.Argument(help="Input files (JSONL or Parquet), globs, or - for stdin.")]
Overwrite = Annotated[bool, typer.Option(help="Replace an existing output folder.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or summaries on stderr.")]


def progress(quiet: bool = False) -> Progress:
    """A progress bar on stderr (stdout stays clean for piping)."""
    return Progress(SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(), console=stderr,
                    disable=quiet, transient=False)


def refuse_existing(path: str | Path, overwrite: bool) -> None:
    path = Path(path)
    if path.exists() and any(path.iterdir() if path.is_dir() else [path]) and not overwrite:
        raise OutputExists(f"{path} already exists", fix="pass --overwrite to replace it, or choose another path")
