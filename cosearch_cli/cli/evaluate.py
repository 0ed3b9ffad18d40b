"""`cosearch evaluate`: the paper's tables from rollouts, or a question-by-question comparison of two runs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.table import Table

from cosearch_cli.artifacts import Reader, Writer, make_manifest, manifest_path, write_json_atomic
from cosearch_cli.cli import app
from cosearch_cli.cli.common import Quiet, Seed, stderr
from cosearch_cli.errors import ConfigError, InputError
from cosearch_cli.evaluate import Comparison, Evaluation, compare, evaluate, read_run
from cosearch_cli.plots import comparison_figure, f1_figure

_JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def load_run(path: str) -> tuple[list, Reader]:
    """Read one run (a file, a quoted glob of shards, or - for stdin) and refuse an empty one."""
    reader = Reader.open(path)
    records = read_run(reader.rows())
    if not records:
        raise InputError("no rollout records in this input", path=path,
                         fix="pass the output of `cosearch rollout` (the file is empty)")
    return records, reader


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render(rows: list[dict], columns: list[tuple[str, str]], title: str) -> Table:
    table = Table(title=title, title_style="bold", caption_justify="left")
    for _, header in columns:
        table.add_column(header, justify="left" if header in ("dataset", "") else "right")
    for row in rows:
        style = "bold" if row.get("dataset") in ("single-hop", "multi-hop", "average") else None
        table.add_row(*[_fmt(row.get(key)) for key, _ in columns], style=style)
    return table


_RUN_COLUMNS = [("dataset", "dataset"), ("questions", "n"), ("em", "EM"), ("f1", "F1"), ("subem", "SubEM"),
                ("searches", "searches"), ("format_fail", "fmt fail"), ("hit@1", "Hit@1"), ("hit@3", "Hit@3"),
                ("hit@5", "Hit@5"), ("invalid", "invalid"), ("answer_in_candidates", "ans in cands")]


def show(table: Table) -> None:
    """Print a table on stderr; a log file (no terminal) gets the full width instead of squashed columns."""
    console = stderr if stderr.is_terminal else Console(stderr=True, width=200)
    console.print(table)


def write_table(path: str, rows: list[dict], manifest: dict) -> None:
    with Writer(path) as out:
        out.write_all(rows)
        out.manifest = manifest


def write_png(path: str, data: bytes, manifest: dict) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(target)
    write_json_atomic(manifest_path(target), manifest)


def write_summary(path: str, summary: dict) -> None:
    if path == "-":
        sys.stdout.buffer.write(orjson.dumps(summary, option=_JSON_OPTIONS))
        sys.stdout.flush()
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, summary)


@app.command("evaluate")
def evaluate_command(
    runs: Annotated[list[str], typer.Argument(
        help="One run to score, or two runs (A then B) to compare question by question. Each is a rollout "
             "file (.jsonl/.parquet), a quoted glob of one run's shards, or - for stdin.")],
    output: Annotated[str, typer.Option("--output", "-o",
                                        help="Where to write the JSON summary (a .json path, or - for stdout).")] = "-",
    per_question: Annotated[str | None, typer.Option(
        help="Write per-question scores here (.parquet or .jsonl); for two runs: A, B and B - A.")] = None,
    per_dataset: Annotated[str | None, typer.Option(
        help="Write the per-dataset and single/multi/average rows here (.parquet or .jsonl).")] = None,
    plot: Annotated[str | None, typer.Option(
        help="Write a PNG of per-dataset F1 here (for two runs: both runs and the paired differences).")] = None,
    yes_no_rule: Annotated[bool, typer.Option(
        "--yes-no-rule", help="HotpotQA's official F1 rule: when prediction or gold is yes/no/noanswer and they "
                              "differ, F1 is 0 (applied to every dataset). Off by default, as Search-R1 and "
                              "CoSearch score.")] = False,
    bootstrap: Annotated[int, typer.Option(help="Paired-bootstrap replicates for comparisons.")] = 1000,
    confidence: Annotated[float, typer.Option(help="Confidence level of the bootstrap interval.")] = 0.95,
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Score rollouts as the papers report them (EM, F1, SubEM per dataset; single-hop / multi-hop / average;
    search turns; ranker Hit@1/3/5 of the observations; invalid ranker outputs; agent format failures), or
    compare two runs with a paired bootstrap interval per dataset.

    A question's score is the mean over its trajectories (greedy runs have one); groups are unweighted means
    over datasets. The table goes to stderr; the JSON summary to stdout (or -o).
    """
    if len(runs) > 2:
        raise ConfigError(f"got {len(runs)} runs", fix="pass one run to score or two runs (A B) to compare; "
                                                       "quote a glob to give one run as several shards")
    if bootstrap < 1 or not 0.0 < confidence < 1.0:
        raise ConfigError("--bootstrap must be >= 1 and --confidence between 0 and 1",
                          fix="e.g. --bootstrap 1000 --confidence 0.95")
    options = {"runs": runs, "yes_no_rule": yes_no_rule, "bootstrap": bootstrap, "confidence": confidence}
    loaded = [load_run(path) for path in runs]
    hashes, upstream = {}, []
    for _, reader in loaded:
        hashes.update(reader.hashes)
        upstream.extend(reader.upstream)
    evaluations = [evaluate(records, yes_no_rule=yes_no_rule) for records, _ in loaded]
    options["variant"] = [e.variant for e in evaluations]
    manifest = make_manifest("evaluate", options, inputs=hashes, seed=seed, upstream=upstream)

    if len(evaluations) == 1:
        _report_one(evaluations[0], manifest, output, per_question, per_dataset, plot, quiet)
    else:
        labels = (Path(runs[0]).stem, Path(runs[1]).stem)
        if labels[0] == labels[1]:
            labels = ("A", "B")
        result = compare(*evaluations, samples=bootstrap, seed=seed, confidence=confidence)
        _report_two(result, labels, manifest, output, per_question, per_dataset, plot, quiet)


def _report_one(evaluation: Evaluation, manifest: dict, output: str, per_question: str | None,
                per_dataset: str | None, plot: str | None, quiet: bool) -> None:
    rows = evaluation.datasets + evaluation.groups
    name = evaluation.summary()["variant_name"]
    if per_question:
        write_table(per_question, [s.row() for s in evaluation.questions], manifest)
    if per_dataset:
        write_table(per_dataset, rows, manifest)
    if plot:
        write_png(plot, f1_figure(rows, name), manifest)
    if not quiet:
        show(render(rows, _RUN_COLUMNS, f"Evaluation - {name}"))
    write_summary(output, evaluation.summary() | {"manifest": manifest})


def _report_two(result: Comparison, labels: tuple[str, str], manifest: dict, output: str,
                per_question: str | None, per_dataset: str | None, plot: str | None, quiet: bool) -> None:
    names = [result.a.summary()["variant_name"], result.b.summary()["variant_name"]]
    if names[0] != names[1] and not quiet:
        stderr.print(f"[yellow]warning:[/] the runs were scored differently: A = {names[0]}; B = {names[1]}")
    name = names[0] if names[0] == names[1] else f"A: {names[0]} | B: {names[1]}"
    if per_question:
        write_table(per_question, result.questions, manifest)
    if per_dataset:
        write_table(per_dataset, result.differences, manifest)
    if plot:
        confidence = result.bootstrap["confidence"]
        write_png(plot, comparison_figure(result.differences, labels, name, confidence), manifest)
    if not quiet:
        for label, evaluation in zip(labels, (result.a, result.b)):
            show(render(evaluation.datasets + evaluation.groups, _RUN_COLUMNS, f"{label}"))
        level = f"{result.bootstrap['confidence']:.0%}"
        columns = [("dataset", "dataset"), ("questions", "n"), ("f1_a", f"F1 {labels[0]}"),
                   ("f1_b", f"F1 {labels[1]}"), ("f1_diff", "B - A"), ("f1_ci_low", f"{level} CI low"),
                   ("f1_ci_high", f"{level} CI high"), ("em_diff", "EM B - A")]
        show(render(result.differences, columns, f"Paired comparison (B - A) - {name}"))
    summary = result.summary() | {"labels": list(labels), "manifest": manifest}
    write_summary(output, summary)
