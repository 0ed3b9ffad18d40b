"""`cosearch evaluate`: the paper's tables from rollouts, a question-by-question comparison of two runs, and a
ranker's quality on the fixed calls of one run.

`cosearch evaluate RUNS...` is `cosearch evaluate score RUNS...` (the group's default command), so the
original usage keeps working next to `evaluate ranker`.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.table import Table

from typer.core import TyperGroup

from cosearch_cli.artifacts import (Reader, Writer, make_manifest, manifest_path, mark_partial, write_bytes_atomic,
                                    write_json_atomic)
from cosearch_cli.cli import app
from cosearch_cli.cli.common import AllowPartial, Device, Dtype, Quiet, Seed, progress, stderr
from cosearch_cli.errors import ConfigError, InputError
from cosearch_cli.evaluate import Comparison, Evaluation, compare, evaluate, read_run
from cosearch_cli.plots import comparison_figure, f1_figure

_JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE
_DEFAULT = "score"


class _DefaultScore(TyperGroup):
    """A group whose first argument, when it names no sub-command, goes to `score` (`evaluate run.jsonl`)."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = [_DEFAULT, *args]
        return super().parse_args(ctx, args)


SummaryOutput = Annotated[str, typer.Option("--output", "-o",
                                            help="Where to write the JSON summary (a .json path, or - for stdout).")]
Bootstrap = Annotated[int, typer.Option(help="Paired-bootstrap replicates for comparisons.")]
Confidence = Annotated[float, typer.Option(help="Confidence level of the bootstrap interval.")]
Constrain = Annotated[str, typer.Option(
    help="Constrained ranker decoding: recorded (as the rollout that made the calls did), auto (on for the "
         "embedded model or a checkpoint trained from it), none, or ranker.")]
Backend = Annotated[str, typer.Option(help="Generation backend: hf (transformers) or vllm.")]
BatchSize = Annotated[int, typer.Option(help="Ranker calls generated per batch.")]


def check_bootstrap(bootstrap: int, confidence: float) -> None:
    if bootstrap < 1 or not 0.0 < confidence < 1.0:
        raise ConfigError("--bootstrap must be >= 1 and --confidence between 0 and 1",
                          fix="e.g. --bootstrap 1000 --confidence 0.95")


evaluate_app = typer.Typer(
    cls=_DefaultScore, no_args_is_help=True, rich_markup_mode=None,
    help="Score rollouts (`cosearch evaluate RUN [RUN_B]`, the same as `evaluate score`), or judge a ranker "
         "model on the fixed ranker calls of one run (`evaluate ranker`).")
app.add_typer(evaluate_app, name="evaluate")


def load_run(path: str, allow_partial: bool = False) -> tuple[list, Reader]:
    """Read one run (a file, a quoted glob of shards, or - for stdin) and refuse an empty one."""
    reader = Reader.open(path, stage_stream=True, allow_partial=allow_partial)
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
        table.add_column(header, justify="left" if header in ("dataset", "ranker", "") else "right")
    for row in rows:
        style = "bold" if row.get("dataset") in ("single-hop", "multi-hop", "average") else None
        table.add_row(*[_fmt(row.get(key)) for key, _ in columns], style=style)
    return table


_RUN_COLUMNS = [("dataset", "dataset"), ("questions", "n"), ("em", "EM"), ("f1", "F1"), ("subem", "SubEM"),
                ("searches", "searches"), ("format_fail", "fmt fail"), ("hit@1", "Hit@1"), ("hit@3", "Hit@3"),
                ("hit@5", "Hit@5"), ("no_candidates", "no cands"), ("invalid", "invalid"),
                ("answer_in_candidates", "ans in cands")]


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
    write_bytes_atomic(target, data)
    write_json_atomic(manifest_path(target), manifest)


def write_summary(path: str, summary: dict) -> None:
    if path == "-":
        sys.stdout.buffer.write(orjson.dumps(summary, option=_JSON_OPTIONS))
        sys.stdout.flush()
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, summary)


@evaluate_app.command(_DEFAULT)
def evaluate_command(
    runs: Annotated[list[str], typer.Argument(
        help="One run to score, or two runs (A then B) to compare question by question. Each is a rollout "
             "file (.jsonl/.parquet), a quoted glob of one run's shards, or - for stdin.")],
    output: SummaryOutput = "-",
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
    bootstrap: Bootstrap = 1000,
    confidence: Confidence = 0.95,
    seed: Seed = 0,
    allow_partial: AllowPartial = False,
    quiet: Quiet = False,
) -> None:
    """Score rollouts as the papers report them (EM, F1, SubEM per dataset; single-hop / multi-hop / average;
    search turns; ranker Hit@1/3/5 of the observations; calls with no candidates; invalid ranker outputs among
    the calls with candidates; agent format failures), or
    compare two runs with a paired bootstrap interval per dataset.

    A question's score is the mean over its trajectories (greedy runs have one); groups are unweighted means
    over datasets. The table goes to stderr; the JSON summary to stdout (or -o). `cosearch evaluate RUNS` runs
    this command.
    """
    if len(runs) > 2:
        raise ConfigError(f"got {len(runs)} runs", fix="pass one run to score or two runs (A B) to compare; "
                                                       "quote a glob to give one run as several shards")
    check_bootstrap(bootstrap, confidence)
    options = {"runs": runs, "yes_no_rule": yes_no_rule, "bootstrap": bootstrap, "confidence": confidence}
    loaded = [load_run(path, allow_partial) for path in runs]
    hashes, upstream = {}, []
    for _, reader in loaded:
        hashes.update(reader.hashes)
        upstream.extend(reader.upstream)
    evaluations = [evaluate(records, yes_no_rule=yes_no_rule) for records, _ in loaded]
    options["variant"] = [e.variant for e in evaluations]
    manifest = mark_partial(make_manifest("evaluate", options, inputs=hashes, seed=seed, upstream=upstream),
                            [reader for _, reader in loaded])

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


# ---------------------------------------------------------------------------------------------------------
# `cosearch evaluate ranker`

def constrained(choice: str, records: list, model: str) -> bool:
    """Whether the ranker decodes under the rollout's constraint: `recorded` follows the run that made the
    calls (its `sampling.constrain`), anything else is read as rollout's --constrain for this model."""
    from cosearch_cli.constrain import parse_roles

    if choice == "recorded":
        return any("ranker" in r.sampling.get("constrain", []) for r in records)
    return "ranker" in parse_roles(choice, model)


def rerank_with(model: str, calls, records: list, opened, *, constrain: str, backend: str, batch_size: int,
                quiet: bool, label: str, device: str = "auto", dtype: str = "float32") -> list:
    """Load `model`, re-run it on the fixed calls, free it; its per-call scores."""
    from cosearch_cli.generation import load_backend
    from cosearch_cli.ranker_quality import rerank

    loaded = load_backend(model, backend, device=device, dtype=dtype)
    with progress(quiet) as bar:
        task = bar.add(f"ranking ({label})", len(calls.pairs), unit="calls")
        scores = rerank(calls, loaded, opened.docs, constrained=constrained(constrain, records, model),
                        batch=batch_size, on_progress=lambda n: bar.advance(task, n))
    del loaded
    return scores


def warn_thin(datasets: list[str]) -> None:
    if datasets:
        stderr.print(f"[yellow]note:[/] {', '.join(datasets)}: one scored question each, so the ranker intervals "
                     "take their differences as exact; use more questions per dataset")


_ORDER_COLUMNS = [("order", "order"), ("calls", "calls"), ("calls_with_answer", "with answer"), ("hit1", "Hit@1"),
                  ("ndcg", "nDCG@K"), ("invalid", "invalid")]
_DIFF_COLUMNS = [("comparison", "B - A"), ("metric", "metric"), ("diff", "diff"), ("ci_low", "CI low"),
                 ("ci_high", "CI high")]


@evaluate_app.command("ranker")
def ranker_command(
    calls: Annotated[str, typer.Option(
        help="Rollout file whose ranker calls (sub-query, question, candidates) are given again to the ranker: "
             "usually a greedy evaluation run (runs/NAME/eval-init/rollouts.jsonl).")],
    index: Annotated[str, typer.Option(help="The index those calls were retrieved from (passage texts): a folder, or "
                                                    "http://HOST:PORT of `cosearch serve`.")],
    ranker_model: Annotated[str, typer.Option(help="Ranker to judge: 'smollm2' or a local HF folder.")],
    baseline_model: Annotated[str | None, typer.Option(
        help="A second ranker judged on the same calls (e.g. the untrained one); B - A is then "
             "ranker-model - baseline-model.")] = None,
    output: SummaryOutput = "-",
    per_call: Annotated[str | None, typer.Option(
        help="Write every call's scores here (.parquet or .jsonl): one row per call and order.")] = None,
    ranker_passage_tokens: Annotated[int | None, typer.Option(
        help="Tokens of each candidate the rankers read (default: the rollout's own); the calls, candidates and "
             "scoring stay the same.")] = None,
    constrain: Constrain = "recorded",
    backend: Backend = "hf",
    batch_size: BatchSize = 16,
    bootstrap: Bootstrap = 1000,
    confidence: Confidence = 0.95,
    device: Device = "auto",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Judge a ranker model on the fixed ranker calls of one run: Hit@1 and nDCG@K of answer-bearing passages.

    Every call with candidates is ranked again, greedy, with the rollout's prompt, constraint and parsing and
    the run's own K; an invalid output counts as the rollout's fallback (the retriever's top-K) and is
    counted. Only calls with an answer-bearing candidate are scored (their number is reported). The
    retriever's own order (what --ranker none shows) is scored on the same calls, and each difference gets a
    paired bootstrap interval that resamples questions within datasets, a question's calls together.
    """
    from cosearch_cli.index import index_location, open_index
    from cosearch_cli.ranker_quality import fixed_calls, paired_difference, quality, retriever_scores

    check_bootstrap(bootstrap, confidence)
    records, reader = load_run(calls)
    fixed = fixed_calls(records)
    if ranker_passage_tokens is not None:
        if ranker_passage_tokens < 1:
            raise ConfigError("--ranker-passage-tokens must be at least 1", fix="e.g. --ranker-passage-tokens 96")
        fixed.config = replace(fixed.config, ranker_passage_tokens=ranker_passage_tokens)
    opened = open_index(index)
    engine = dict(constrain=constrain, backend=backend, batch_size=batch_size, quiet=quiet, device=device,
                  dtype=dtype)
    orders = {"ranker": rerank_with(ranker_model, fixed, records, opened, label="ranker-model", **engine)}
    if baseline_model is not None:
        orders["baseline"] = rerank_with(baseline_model, fixed, records, opened, label="baseline-model", **engine)
    orders["retriever"] = retriever_scores(fixed)
    pairs = [("ranker", "retriever")]
    if baseline_model is not None:
        pairs += [("ranker", "baseline"), ("baseline", "retriever")]
    settings = dict(samples=bootstrap, seed=seed, confidence=confidence)
    differences = {f"{b}_vs_{a}": {metric: paired_difference(orders[a], orders[b], metric, **settings)
                                   for metric in ("hit1", "ndcg")} for b, a in pairs}
    options = {"calls": calls, "index": index_location(index), "ranker_model": ranker_model,
               "baseline_model": baseline_model, "constrain": constrain, "backend": backend,
               "bootstrap": bootstrap, "confidence": confidence, "k": fixed.k,
               "ranker_passage_tokens": fixed.config.ranker_passage_tokens}
    manifest = make_manifest("evaluate-ranker", options, inputs=reader.hashes, seed=seed,
                             upstream=reader.upstream + [opened.manifest])
    summary = {"kind": "ranker_quality", "questions": fixed.questions(), "calls": len(fixed.pairs),
               "calls_with_answer": sum(s.hit1 is not None for s in orders["retriever"]),
               "skipped_no_candidates": fixed.skipped_no_candidates, "k": fixed.k,
               "orders": {name: quality(scores) for name, scores in orders.items()},
               "differences": differences,
               "bootstrap": settings | {"resampling": "questions within each dataset, paired; a question's "
                                                      "calls together"}}
    if per_call:
        rows = [asdict(s) | {"order": name} for name, scores in orders.items() for s in scores]
        write_table(per_call, rows, manifest)
    if not quiet:
        show(render([{"order": name} | q for name, q in summary["orders"].items()], _ORDER_COLUMNS,
                    f"Ranker quality on {len(fixed.pairs)} fixed calls (K = {fixed.k})"))
        level = f"{confidence:.0%}"
        rows = [{"comparison": name, "metric": metric} | boot.get("average", {})
                for name, by_metric in differences.items() for metric, boot in by_metric.items()]
        show(render(rows, _DIFF_COLUMNS, f"Paired differences on the same calls, average, {level} CI"))
        warn_thin(summary["orders"]["retriever"]["thin_datasets"])
    write_summary(output, summary | {"manifest": manifest})


# ---------------------------------------------------------------------------------------------------------
# `cosearch evaluate compare`

_GAIN_ROWS = [("agent F1", "agent_f1"), ("agent EM", "agent_em"), ("ranker Hit@1", "ranker_hit1"),
              ("ranker nDCG@K", "ranker_ndcg")]


def _gain_rows(report: dict) -> list[dict]:
    rows = []
    for label, key in _GAIN_ROWS:
        if report.get(f"{key}_before") is None:
            continue
        low, high = report[f"{key}_gain_ci"] or (None, None)
        rows.append({"figure": label, "before": report[f"{key}_before"], "after": report[f"{key}_after"],
                     "gain": report[f"{key}_gain"], "ci_low": low, "ci_high": high})
    if report.get("retriever_hit1") is not None:
        for label, key in (("after - retriever Hit@1", "ranker_vs_retriever"),
                           ("before - retriever Hit@1", "ranker_before_vs_retriever")):
            low, high = report[f"{key}_ci"] or (None, None)
            rows.append({"figure": label, "before": report["retriever_hit1"], "gain": report[key], "ci_low": low,
                         "ci_high": high})
    return rows


@evaluate_app.command("compare")
def compare_command(
    before: Annotated[str, typer.Argument(help="Greedy evaluation rollouts of the models before training.")],
    after: Annotated[str, typer.Argument(help="Greedy evaluation rollouts of the trained models, same questions.")],
    index: Annotated[str | None, typer.Option(
        help="The index the rollouts searched (a folder or http://HOST:PORT of `cosearch serve`); needed "
             "for the ranker figures (without it only the agent's are given).")] = None,
    ranker_before: Annotated[str | None, typer.Option(
        help="The ranker model before training ('smollm2' or a local HF folder; default: none, i.e. the "
             "retriever's order, as a run without an LLM ranker shows).")] = None,
    ranker_after: Annotated[str | None, typer.Option(
        help="The trained ranker model (default: none, the retriever's order).")] = None,
    calls: Annotated[str, typer.Option(
        help="The ranker calls both rankers are judged on: before (BEFORE's calls: the untrained agent's "
             "sub-queries), after, or a rollout file (e.g. one set of calls for several presets).")] = "before",
    output: SummaryOutput = "-",
    yes_no_rule: Annotated[bool, typer.Option("--yes-no-rule", help="HotpotQA's yes/no F1 rule (see "
                                                                    "`evaluate score`).")] = False,
    constrain: Constrain = "recorded",
    backend: Backend = "hf",
    batch_size: BatchSize = 16,
    bootstrap: Bootstrap = 1000,
    confidence: Confidence = 0.95,
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Before vs after training on held-out questions: agent F1/EM and the ranker's Hit@1/nDCG@K on fixed
    calls, each gain with a paired bootstrap interval, and each ranker against the retriever's own order.

    The JSON report holds questions, agent_f1_before, agent_f1_after, agent_f1_gain_ci [low, high], the same
    for EM, ranker_hit1_before, ranker_hit1_after, ranker_hit1_gain_ci, retriever_hit1,
    ranker_vs_retriever_ci (trained ranker - retriever), the nDCG figures and the counts of calls.
    """
    from cosearch_cli.gains import compare_runs
    from cosearch_cli.ranker_quality import fixed_calls

    check_bootstrap(bootstrap, confidence)
    if index is None and (ranker_before or ranker_after):
        raise ConfigError("--ranker-before/--ranker-after need --index (the passages of the calls)",
                          fix="pass the index the rollouts searched")
    (records_before, reader_before), (records_after, reader_after) = load_run(before), load_run(after)
    upstream = reader_before.upstream + reader_after.upstream
    hashes = reader_before.hashes | reader_after.hashes
    fixed = scores_before = scores_after = None
    if index is not None:
        from cosearch_cli.index import index_location, open_index

        if calls in ("before", "after"):
            source = records_before if calls == "before" else records_after
        else:
            source, reader_calls = load_run(calls)
            upstream += reader_calls.upstream
            hashes |= reader_calls.hashes
        fixed = fixed_calls(source)
        opened = open_index(index)
        upstream.append(opened.manifest)
        common = dict(constrain=constrain, backend=backend, batch_size=batch_size, quiet=quiet)
        if ranker_before is not None:
            scores_before = rerank_with(ranker_before, fixed, source, opened, label="ranker-before", **common)
        if ranker_after is not None:
            scores_after = rerank_with(ranker_after, fixed, source, opened, label="ranker-after", **common)
    report = compare_runs(records_before, records_after, calls=fixed, ranker_before=scores_before,
                          ranker_after=scores_after, samples=bootstrap, seed=seed, confidence=confidence,
                          yes_no_rule=yes_no_rule)
    options = {"before": before, "after": after, "index": index_location(index) if index else None,
               "ranker_before": ranker_before, "ranker_after": ranker_after, "calls": calls,
               "constrain": constrain, "backend": backend, "yes_no_rule": yes_no_rule, "bootstrap": bootstrap,
               "confidence": confidence}
    manifest = make_manifest("evaluate-compare", options, inputs=hashes,
                             seed=seed, upstream=upstream)
    if not quiet:
        columns = [("figure", ""), ("before", "before"), ("after", "after"), ("gain", "gain"),
                   ("ci_low", f"{confidence:.0%} CI low"), ("ci_high", "CI high")]
        show(render(_gain_rows(report), columns, f"Before vs after on {report['questions']} held-out questions"))
        warn_thin((report["ranker_counts"] or {}).get("thin_datasets", []))
    write_summary(output, {"kind": "learning_gain", **report, "manifest": manifest})
