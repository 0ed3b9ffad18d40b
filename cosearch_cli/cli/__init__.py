"""The `cosearch` command: a thin Typer shell over the stage functions.

Each stage lives in its own module here and registers itself on `app`. Stage logic never prints or touches
paths; these modules parse options, read artifacts, call the stage and write artifacts. Logs and progress
go to stderr so stdout carries only data and stages pipe.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading

import typer

from typer.core import TyperGroup

from cosearch_cli import __version__
from cosearch_cli.errors import CosearchError, storage_error


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every `finally` and `with` removes its temporaries on the way out."""


def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush into a closed pipe stays silent."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # no real file descriptor (e.g. a test runner's buffer)
        pass


class _Group(TyperGroup):
    """Turns a CosearchError from any command into one line on stderr and the error's exit code; an
    interrupt (Ctrl-C, SIGTERM) into "interrupted" and 130/143; a reader that closed our stdout pipe
    (`cosearch ... | head`) into a quiet exit 141, as for other Unix tools."""

    def invoke(self, ctx):
        main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
        try:
            return self._invoke(ctx)
        finally:
            from cosearch_cli.cli.common import release_held

            release_held()
            if main_thread:
                signal.signal(signal.SIGTERM, previous)

    def _invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except CosearchError as exc:
            typer.echo(f"error: {exc}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt as exc:
            typer.echo("interrupted", err=True)
            ctx.exit(143 if isinstance(exc, Terminated) else 130)
        except BrokenPipeError:
            _quiet_stdout()
            ctx.exit(128 + signal.SIGPIPE)
        except Exception as exc:  # a full disk or unwritable folder is not a bug: one line, exit 9
            storage = storage_error(exc)
            if storage is None:
                raise
            typer.echo(f"error: {storage}", err=True)
            ctx.exit(storage.exit_code)


app = typer.Typer(
    cls=_Group,
    name="cosearch",
    help=(
        "Train search agents with RL while the document ranker learns with them.\n\n"
        "Stages exchange JSONL/Parquet files and pipe through stdin/stdout (`-`). "
        "Exit codes: 0 ok, 1 internal error, 2 usage, 3 bad input data, 4 bad option values, "
        "5 model problem, 6 index problem, 7 nothing to do, 8 output exists, 9 cannot write (disk full)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# One module per stage; each defines its command(s) on `app` when imported.
STAGE_MODULES: tuple[str, ...] = (
    "index",
    "search",
    "serve",
    "rollout",
    "evaluate",
    "oracle",
    "group",
    "reward",
    "update",
    "warmup",
    "train",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cosearch {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Train search agents with RL while the document ranker learns with them."""


for _name in STAGE_MODULES:
    importlib.import_module(f"cosearch_cli.cli.{_name}")


def main() -> None:
    """Entry point: run the app, turning library errors into one line on stderr and their exit code."""
    try:
        app()  # standalone mode: Typer handles usage errors (exit 2) and --help itself
    except CosearchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
