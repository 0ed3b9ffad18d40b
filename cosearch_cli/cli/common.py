"""Options and helpers shared by every command, declared once so every command spells a flag the same way."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console

from cosearch_cli.errors import OutputExists
from cosearch_cli.progress import Progress

# Messages are not wrapped at the console width: a path or a log line sent to a file (Slurm logs, `2> file`,
# 80 columns by default) stays on one line; tables still fit the width.
stderr = Console(stderr=True, soft_wrap=True)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FIXTURE_INDEX = "indexes/fixture"  # where `cosearch index fixture` and the demo build it

Seed = Annotated[int, typer.Option(help="Random seed; the same seed and inputs give the same artifact.")]
Output = Annotated[str, typer.Option("--output", "-o",
                                     help="Where to write: a .jsonl or .parquet path, or - for stdout.")]
Inputs = Annotated[list[str], typer.Argument(help="Input files (JSONL or Parquet), globs, or - for stdin.")]
Overwrite = Annotated[bool, typer.Option(help="Replace an existing output folder.")]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars or summaries on stderr.")]
Device = Annotated[str, typer.Option(help="Where the model runs: cpu, cuda (or cuda:N), or auto (cuda when "
                                          "available).")]
Dtype = Annotated[str, typer.Option(help="float32, or bfloat16 (halves model memory; for GPUs: on a CPU bf16 is "
                                         "slower).")]
# One vocabulary: --sizes is how big a rollout is (rollout, oracle, warmup), --rules which reward and grouping
# rules apply (group, reward), --preset a whole training run (train). --preset still works where it used to
# mean sizes or rules, hidden from --help.
Sizes = Annotated[Literal["cpu", "paper"], typer.Option(
    "--sizes", help="Rollout sizes. cpu: G=4 N=10 K=3 T=2, 80 new tokens a turn, 48-token passages (fits a 2-core "
                    "CPU). paper: G=8 N=50 K=5 T=6, 500 new tokens a turn, 160-token passages. Options below "
                    "override single values.")]
OldSizes = Annotated[Literal["cpu", "paper"] | None, typer.Option("--preset", hidden=True,
                                                                  help="Old name of --sizes.")]
OldRules = Annotated[Literal["paper", "official"] | None, typer.Option("--preset", hidden=True,
                                                                       help="Old name of --rules.")]
Threads = Annotated[int | None, typer.Option(
    help="CPU threads for torch in this process (default: $SLURM_CPUS_PER_TASK, else $OMP_NUM_THREADS, else "
         "the CPUs this process may use). Give each of N processes sharing a machine 1/N of its cores.")]
Questions = Annotated[list[str] | None, typer.Option(
    "--questions", help="Question JSONL file(s) or quoted globs ({id, question, answers, dataset}); - for stdin. "
                        "Repeat for several files.")]


def use_threads(threads: int | None, quiet: bool) -> None:
    """Set torch's thread count (cosearch_cli/threads.py) and say on stderr what it is and why."""
    from cosearch_cli.threads import set_threads

    count, source = set_threads(threads)
    if not quiet:
        stderr.print(f"torch threads: {count} ({source})", highlight=False)


def fixture_default(value, name: str, default, quiet: bool):
    """`value`, or the fixture `default` announced on stderr, so nobody takes the output for their own data."""
    if value:
        return value
    if not quiet:
        shown = default if isinstance(default, str) else ", ".join(default)
        stderr.print(f"{name} not given: using the fixture's {shown}", highlight=False, markup=False)
    return default
AllowPartial = Annotated[bool, typer.Option(
    "--allow-partial", help="Accept a piped input that ended without its manifest line (its upstream stage "
                            "failed or was stopped) and mark the output partial in its manifest; refused by "
                            "default.")]


_HELD = ExitStack()  # locks held until the running command ends (closed by the `cosearch` group)


def hold_output_lock(target: str | Path) -> None:
    """Lock the output folder `target` (artifacts.output_lock) until the running command ends."""
    from cosearch_cli.artifacts import output_lock

    _HELD.enter_context(output_lock(target))


def release_held() -> None:
    _HELD.close()


def progress(quiet: bool = False) -> Progress:
    """Progress on stderr (stdout stays clean for piping): bars in a terminal, a plain line every 20 s in a
    log file or pipe (cosearch_cli/progress.py)."""
    return Progress(quiet, console=stderr)


def refuse_existing(path: str | Path, overwrite: bool) -> None:
    path = Path(path)
    if path.exists() and any(path.iterdir() if path.is_dir() else [path]) and not overwrite:
        raise OutputExists(f"{path} already exists", fix="pass --overwrite to replace it, or choose another path")
