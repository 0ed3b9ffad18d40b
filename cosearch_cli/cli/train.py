"""`cosearch train` and `cosearch demo`: the joint training loop, and the README's main job."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import orjson
import typer

from cosearch_cli import train as training
from cosearch_cli.cli import app
from cosearch_cli.cli.common import Quiet, progress, stderr


def _runner(config: training.TrainConfig, bar) -> training.Runner:
    task = bar.add_task("rollouts", total=None, visible=False)

    def on_rollout(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total, visible=True)

    def log(message: str) -> None:
        bar.update(task, description=message[:60], completed=0, visible=False)
        bar.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")

    return training.Runner(config, log=log, on_rollout=on_rollout)


@app.command()
def train(
    config: Annotated[Path | None, typer.Option("--config", help="TOML file of TrainConfig keys "
                                                "(see examples/train.toml); unknown keys are rejected.")] = None,
    preset: Annotated[str | None, typer.Option(help="Start from a preset: " + ", ".join(training.PRESETS)
                                               + ". The config file and options override it.")] = None,
    name: Annotated[str | None, typer.Option(help="Run name (folder under --out).")] = None,
    out: Annotated[str | None, typer.Option(help="Folder of run folders (default runs).")] = None,
    iterations: Annotated[int | None, typer.Option(help="Training iterations.")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed of question order, sampling and updates.")] = None,
    quiet: Quiet = False,
) -> None:
    """Iterate rollout -> group -> reward -> update (agent, ranker) with periodic dev evaluation.

    Artifacts of iteration i go to <out>/<name>/iter-NNNN/; metrics.parquet and curves.png sum up the run.
    Killed and started again with the same options, it continues from the last finished step and gives the
    same result as an uninterrupted run. Prints the final metrics row as JSON on stdout.
    """
    cfg = training.load_config(config, preset=preset or (None if config else "demo"), name=name, out=out,
                               iterations=iterations, seed=seed)
    with progress(quiet) as bar:
        root = _runner(cfg, bar).run()
    rows = [orjson.loads(p.read_bytes()) for p in sorted(root.glob("iter-*/metrics.json"))]
    stderr.print(f"run folder: {root} (metrics.parquet, curves.png, iter-*/)")
    typer.echo(orjson.dumps(rows[-1] if rows else {}).decode())


@app.command()
def demo(
    out: Annotated[str, typer.Option(help="Folder of run folders.")] = "runs",
    iterations: Annotated[int | None, typer.Option(help="Training iterations (preset: 2).")] = None,
    quiet: Quiet = False,
) -> None:
    """The main job on the embedded default: index the fixture corpus, evaluate the untrained SmolLM2 agent and
    ranker, train both jointly for a few iterations, evaluate again, run the oracle study, print a summary.

    Finishes in about 15 minutes on a 2-core CPU; rerunning resumes (finished steps are not redone).
    """
    from cosearch_cli.demo import run_demo

    started = time.perf_counter()
    cfg = training.load_config(preset="demo", out=out, iterations=iterations)
    if not Path(cfg.index).exists():  # the same index `cosearch index fixture` builds: BM25 + MiniLM flat
        from cosearch_cli.cli.index import fixture

        fixture(out=cfg.index, dense=True, reencode=False, overwrite=False, quiet=quiet)
    with progress(quiet) as bar:
        summary = run_demo(cfg, _runner(cfg, bar))
    summary["minutes"] = round((time.perf_counter() - started) / 60, 1)
    for line in summary["lines"]:
        stderr.print(line)
    typer.echo(orjson.dumps({k: v for k, v in summary.items() if k != "lines"}).decode())
