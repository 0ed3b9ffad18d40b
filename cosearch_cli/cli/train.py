"""`cosearch train` and `cosearch demo`: the joint training loop, and the README's main job."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import orjson
import typer

from cosearch_cli import train as training
from cosearch_cli.artifacts import output_lock
from cosearch_cli.cli import app
from cosearch_cli.cli.common import Quiet, Threads, progress, stderr, use_threads
from cosearch_cli.demo import DEMO_TIME


def _runner(config: training.TrainConfig, bar) -> training.Runner:
    """A Runner whose steps each show as a task: its log message starts the next one (so a log file gets a
    line every 20 s during an update too), and rollouts count questions, trajectories and tokens."""
    current: list = []

    def log(message: str) -> None:
        if current:
            bar.finish(current.pop())
        bar.log(message)
        current.append(bar.add(message, live=lambda: runner.rollout_live))

    def on_rollout(done: int, total: int, unit: str = "questions") -> None:
        if current:
            current[0].unit = unit
            bar.update(current[0], done=done, total=total)

    runner = training.Runner(config, log=log, on_rollout=on_rollout)
    return runner


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
    threads: Threads = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or auto (cuda when available; default auto).")]
    = None,
    dtype: Annotated[str | None, typer.Option(
        help="float32 (default) or bfloat16: bf16 engines and reference, bf16 autocast updates over fp32 master "
             "weights.")] = None,
    backend: Annotated[str | None, typer.Option(help="Generation backend of agent and ranker: hf or vllm.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the resolved configuration of every stage "
                                          "(JSON on stdout) and the memory plan (stderr), load no model, and exit; "
                                          "exit 4 when the plan does not fit the GPUs.")] = False,
    quiet: Quiet = False,
) -> None:
    """Iterate rollout -> group -> reward -> update (agent, ranker) with periodic dev evaluation.

    Artifacts of iteration i go to <out>/<name>/iter-NNNN/; metrics.parquet and curves.png sum up the run.
    Killed and started again with the same options, it continues from the last finished step and gives the
    same result as an uninterrupted run. A finished run continues with a larger --iterations (the one option
    that may change): the longer run from the start, plus the evaluation its old last iteration made. A run
    folder copied under another --name (or --out) continues the same way, leaving the original untouched.
    Prints the final metrics row as JSON on stdout.
    """
    cfg = training.load_config(config, preset=preset or (None if config else "demo"), name=name, out=out,
                               iterations=iterations, seed=seed, device=device, dtype=dtype, backend=backend)
    if dry_run:
        _dry_run(cfg, quiet)
        return
    use_threads(threads, quiet)
    with output_lock(Path(cfg.out) / cfg.name), progress(quiet) as bar:  # one writer per run folder
        root = _runner(cfg, bar).run()
    rows = [orjson.loads(p.read_bytes()) for p in sorted(root.glob("iter-*/metrics.json"))]
    stderr.print(f"run folder: {root} (metrics.parquet, curves.png, iter-*/)")
    typer.echo(orjson.dumps(rows[-1] if rows else {}).decode())


def _dry_run(cfg: training.TrainConfig, quiet: bool) -> None:
    from cosearch_cli.dry_run import dry_run
    from cosearch_cli.memory_plan import refusal

    resolved, plan = dry_run(cfg)
    typer.echo(orjson.dumps(resolved, option=orjson.OPT_INDENT_2).decode())
    if plan is None:
        if not quiet:
            stderr.print("memory plan: none (the run is on the CPU)")
        return
    if not quiet:
        for line in plan.lines():
            stderr.print(line, markup=False, highlight=False, soft_wrap=True)
    if not plan.fits:
        raise refusal(plan, cfg)


_DEMO_ITERATIONS = training.PRESETS["demo"]["iterations"]


@app.command(help=f"""The main job on the embedded default: index the fixture corpus, evaluate the untrained SmolLM2
agent and ranker, train both jointly for {_DEMO_ITERATIONS} iterations, evaluate again, run the oracle study, print
a summary.

Measured: {DEMO_TIME}. Rerunning resumes (finished steps are not redone).""")
def demo(
    out: Annotated[str, typer.Option(help="Folder of run folders.")] = "runs",
    iterations: Annotated[int | None, typer.Option(
        help=f"Training iterations (default: the demo preset's {_DEMO_ITERATIONS}).")] = None,
    config: Annotated[str | None, typer.Option(
        "--config", help="TOML file of TrainConfig keys that change the demo preset's, for a variant of the "
                         "demo (give it its own `name`); e.g. bench/demo_answerable.toml.")] = None,
    threads: Threads = None,
    quiet: Quiet = False,
) -> None:
    from cosearch_cli.demo import run_demo

    started = time.perf_counter()
    cfg = training.load_config(config, preset="demo", out=out, iterations=iterations)
    if not quiet:
        stderr.print(f"cosearch demo: {cfg.iterations} training iterations and the oracle study on the fixture; "
                     f"measured {DEMO_TIME}. Progress follows on stderr.", highlight=False, markup=False)
    use_threads(threads, quiet)
    if not Path(cfg.index).exists():  # the same index `cosearch index fixture` builds: BM25 + MiniLM flat
        from cosearch_cli.cli.index import fixture

        fixture(out=cfg.index, dense=True, reencode=False, overwrite=False, quiet=quiet)
    with output_lock(Path(cfg.out) / cfg.name), progress(quiet) as bar:
        summary = run_demo(cfg, _runner(cfg, bar))
    summary["minutes"] = round((time.perf_counter() - started) / 60, 1)
    for line in summary["lines"]:
        stderr.print(line)
    typer.echo(orjson.dumps({k: v for k, v in summary.items() if k != "lines"}).decode())
