"""`cosearch oracle`: the retrieval-bottleneck study (paper Table 1), resumable, with a Markdown + PNG report."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from cosearch_cli.artifacts import Reader, make_manifest, write_json_atomic
from cosearch_cli.cli import app
from cosearch_cli.cli.common import (Device, Dtype, OldSizes, Quiet, Seed, Sizes, Threads, progress, stderr,
                                     use_threads)
from cosearch_cli.cli.evaluate import show, write_png, write_summary
from cosearch_cli.errors import ConfigError, InputError, NothingToDo, RecordError
from cosearch_cli.evaluate import DATASETS
from cosearch_cli.oracle import (ORACLE, StudyFolder, finished_in_every_half, interleave, pending_halves,
                                 report_markdown, run_study, study_halves, summarize)
from cosearch_cli.plots import oracle_figure
from cosearch_cli.records import Question, read_question


def read_questions(paths: list[str], per_dataset: int) -> tuple[list[Question], Reader]:
    """Questions in file order; with per_dataset > 0 only the first that many of each dataset."""
    reader = Reader.open(paths)
    questions: list[Question] = []
    taken: dict[str, int] = {}
    seen: set[str] = set()
    for row in reader.rows():
        question = read_question(row.data, row.path, row.line)
        if question.dataset not in DATASETS:
            raise RecordError(f"unknown dataset {question.dataset!r} for question {question.id!r}", path=row.path,
                              line=row.line, fix=f"dataset must be one of {', '.join(DATASETS)}")
        if question.id in seen:
            raise RecordError(f"question {question.id!r} appears twice", path=row.path, line=row.line,
                              fix="give each question a unique id")
        seen.add(question.id)
        if per_dataset and taken.get(question.dataset, 0) >= per_dataset:
            continue
        taken[question.dataset] = taken.get(question.dataset, 0) + 1
        questions.append(question)
    if not questions:
        raise InputError("no questions in the input", path=", ".join(paths), fix="pass a question JSONL file")
    return questions, reader


class _Models:
    """Loads agent, ranker and index on first use, so a finished study reports without loading anything."""

    def __init__(self, agent: str, ranker_model: str, index: str, constrain: str | None, engine: dict):
        self.names = (agent, ranker_model)
        self.engine = engine  # device and dtype of the hf backend
        self.index_folder = index
        self.constrain = constrain
        self._agent = self._ranker = self._index = None

    def index(self):
        if self._index is None:
            from cosearch_cli.index import open_index

            self._index = open_index(self.index_folder)
        return self._index

    def agent(self):
        if self._agent is None:
            from cosearch_cli.rollout import load_backend

            self._agent = load_backend(self.names[0], **self.engine)
        return self._agent

    def ranker(self):
        if self._ranker is None:
            from cosearch_cli.rollout import load_backend

            same = self.names[1] == self.names[0]
            self._ranker = self.agent() if same else load_backend(self.names[1], **self.engine)
        return self._ranker

    def constraints(self, config, half: str):
        """Constrained decoding per role (`--constrain`), as `cosearch rollout` builds it."""
        from cosearch_cli.rollout import constraint_factories

        ranker = self.ranker() if half == "llm" else None
        agent_c, ranker_c = constraint_factories(self.constrain, self.names[0], self.agent(), ranker, self.names[1])
        return replace(config, agent_constraint=agent_c, ranker_constraint=ranker_c)


@app.command("oracle")
def oracle_command(
    questions: Annotated[list[str], typer.Option(
        "--questions", help="Question JSONL file(s) or quoted globs (the shared data's question shape).")],
    index: Annotated[str, typer.Option(help="Index folder (from `cosearch index`), or http://HOST:PORT of "
                                                           "`cosearch serve`.")],
    ranker: Annotated[list[str], typer.Option(
        help="Standard ranker(s) to compare with the oracle: llm (generative listwise) or none (retriever "
             "top-K). Repeat to study both; the oracle half is shared.")] = ["llm"],  # noqa: B006
    agent: Annotated[str, typer.Option(help="Agent model: 'smollm2' (embedded) or a local HF folder.")] = "smollm2",
    ranker_model: Annotated[str | None, typer.Option(
        help="Ranker model for --ranker llm (default: the agent's model).")] = None,
    out: Annotated[str, typer.Option(
        help="Study folder: rollouts of each half, report.md, oracle.png, summary.json. Rerunning the same "
             "command continues where it stopped.")] = "runs/oracle-study",
    per_dataset: Annotated[int, typer.Option(
        help="Use only the first N questions of each dataset (0: all).")] = 0,
    preset: Sizes = "cpu",
    old_preset: OldSizes = None,
    n: Annotated[int, typer.Option(help="Trajectories per question; a question scores their mean.")] = 1,
    greedy: Annotated[bool, typer.Option(
        "--greedy/--sample", help="Greedy decoding (the papers' evaluation setting) or seeded sampling.")] = True,
    max_turns: Annotated[int | None, typer.Option(help="Search turns allowed (default: --sizes').")] = None,
    top_n: Annotated[int | None, typer.Option(
        help="Candidates the retriever returns per search, N (default: --sizes').")] = None,
    k: Annotated[int | None, typer.Option(help="Passages shown to the agent, K (default: --sizes').")] = None,
    question_chunk: Annotated[int | None, typer.Option(
        help="Questions in flight at once (the agent's batch is n x this; default: the preset's).")] = None,
    retriever: Annotated[str | None, typer.Option(help="bm25 or dense (default: the index's first).")] = None,
    constrain: Annotated[str, typer.Option(
        help="Constrained decoding: auto (on for each role whose model is the embedded one or a "
             "checkpoint trained from it), none, or agent,ranker.")] = "auto",
    lenient_ranker: Annotated[bool, typer.Option(
        "--lenient-ranker", help="Repair invalid llm rankings instead of falling back to the retriever's "
                                 "top-K (named in the report).")] = False,
    yes_no_rule: Annotated[bool, typer.Option("--yes-no-rule", help="Score with HotpotQA's yes/no F1 rule.")] = False,
    bootstrap: Annotated[int, typer.Option(help="Paired-bootstrap replicates for the oracle-minus-ranker CI.")] = 1000,
    block: Annotated[int, typer.Option(
        help="Advance all halves together, this many questions at a time (0: one half after the other), so an "
             "interrupted study already holds paired results for --report-only.")] = 0,
    report_only: Annotated[bool, typer.Option(
        "--report-only", help="Run nothing: report on the questions every half has finished so far (a partial "
                              "study is labelled as such).")] = False,
    overwrite: Annotated[bool, typer.Option(help="Recompute the requested halves even if --out holds them.")] = False,
    output: Annotated[str, typer.Option("--output", "-o", help="Where to write the JSON summary (or -).")] = "-",
    device: Device = "auto",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    threads: Threads = None,
    quiet: Quiet = False,
) -> None:
    """Run the same questions with the standard ranker(s) and with the oracle ranker (answer-bearing candidates
    promoted to the top K), same agent, settings and seeds; print single-hop / multi-hop / average F1 and the
    relative gap (the paper's Table 1), and write report.md + oracle.png into --out. Resumable."""
    from cosearch_cli.rollout import LiveRollout, RolloutStats, run_rollouts
    from cosearch_cli.rollout import preset as rollout_preset

    preset = old_preset or preset
    halves = study_halves(ranker)
    if per_dataset < 0 or bootstrap < 1 or block < 0:
        raise ConfigError("--per-dataset must be 0 or more and --bootstrap at least 1",
                          fix="e.g. --per-dataset 30 --bootstrap 1000")
    ranker_model = ranker_model or agent
    overrides = dict(max_turns=max_turns, top_n=top_n, k=k, question_chunk=question_chunk)
    overrides = {key: value for key, value in overrides.items() if value is not None}
    config = rollout_preset(preset, n=n, greedy=greedy, seed=seed, retriever=retriever,
                            lenient_ranker=lenient_ranker, **overrides)
    qs, reader = read_questions(questions, per_dataset)
    qs = interleave(qs)
    from cosearch_cli.index import index_location

    folder = StudyFolder(Path(out))
    models = _Models(agent, ranker_model, index, constrain, {"device": device, "dtype": dtype})

    common = {"questions": reader.hashes, "per_dataset": per_dataset, "question_ids": len(qs), "agent": agent,
              "index": index_location(index), "constrain": constrain, "preset": preset}
    common |= {key: value for key, value in config.sampling().items() if key not in ("ranker", "constrain")}

    def settings(half: str) -> dict:
        return common | {"ranker": half} | ({"ranker_model": ranker_model} if half == "llm" else {})

    for half in halves:
        if overwrite:
            folder.remove(half)
        folder.check_settings(half, settings(half))

    def manifest(half: str) -> dict:
        return make_manifest("oracle", settings(half), inputs=reader.hashes, seed=seed,
                             upstream=[models.index().manifest])

    todo = pending_halves(halves, folder)
    if todo and not report_only:
        use_threads(threads, quiet)
    if todo and not quiet and not report_only:
        stderr.print(f"oracle study: {len(qs)} questions; to run: {', '.join(todo)}; reusing: "
                     f"{', '.join(h for h in halves if h not in todo) or 'nothing'}; folder {out}")

    def rollouts(half: str, todo_questions: list[Question]):
        if not todo_questions:
            return
        index = models.index()  # a missing or damaged index fails before any model loads
        half_config = models.constraints(replace(config, ranker=half), half)
        ranker_backend = models.ranker() if half == "llm" else None
        partial = folder.partial(half)
        done_before = len(partial.read_bytes().splitlines()) if partial.is_file() else 0
        stats = RolloutStats()
        with progress(quiet) as bar:
            # The rate and time left count only this run's questions: those finished before are not work done now.
            task = bar.add(f"{half} half", len(todo_questions), unit="questions",
                           live=LiveRollout(stats, (models.agent(), ranker_backend),
                                            len(todo_questions) * half_config.n))
            if done_before:
                bar.log(f"{half} half: {done_before} of {len(qs)} questions finished earlier, "
                        f"{len(todo_questions)} to go")
            for record in run_rollouts(todo_questions, agent=models.agent(), ranker_backend=ranker_backend,
                                       index=index, config=half_config, stats=stats):
                bar.advance(task)
                yield record

    if report_only:
        records = finished_in_every_half(qs, halves, folder)
        if not records[ORACLE]:
            raise NothingToDo(f"no question is finished in every half yet in {out}",
                              fix="run the study first (without --report-only)")
    else:
        records = run_study(qs, halves, folder, rollouts, manifest, time.monotonic, block=block)
    title = "Oracle retrieval study"
    if len(records[ORACLE]) < len(qs):
        title += f" (PARTIAL: {len(records[ORACLE])} of {len(qs)} questions finished in every half)"
    result = summarize(records, yes_no_rule=yes_no_rule, bootstrap=bootstrap, seed=seed)
    _report(result, title, folder, halves, settings, reader, seed, out, output, quiet, questions, index, agent)


# Short headers, so the table fits 80 columns without cutting one (the CI goes in the caption).
_TABLE1_COLUMNS = [("ranker", "ranker"), ("questions", "n"), ("single-hop", "single-hop"),
                   ("multi-hop", "multi-hop"), ("average", "average"), ("gap average", "rel. gap"),
                   ("oracle - this (avg F1)", "oracle - this")]


def table1(table: list[dict], variant: str, confidence: str = "95%"):
    """Table 1's shape (F1 per group, relative gap, oracle - this with its bootstrap CI in the caption)."""
    from cosearch_cli.cli.evaluate import render

    rows = [r | {"gap average": _pct(r.get("gap average")), "oracle - this (avg F1)": _signed(
        r.get("oracle - this (avg F1)"))} for r in table]
    result = render(rows, _TABLE1_COLUMNS, f"Oracle study, F1 (Table 1 shape) - {variant}")
    result.caption = "; ".join(f"{confidence} CI of oracle - {r['ranker']}: [{r['ci_low']:+.3f}, {r['ci_high']:+.3f}]"
                               for r in table if r.get("ci_low") is not None)
    return result


def per_dataset_table(evaluations: dict, variant: str):
    """F1 per dataset and group, one column per half (what oracle.png draws)."""
    from cosearch_cli.cli.evaluate import render

    halves = list(evaluations)
    first = evaluations[halves[0]]
    rows = []
    for name in [r["dataset"] for r in first.datasets + first.groups]:
        row = {"dataset": name, "questions": next(r["questions"] for r in first.datasets + first.groups
                                                  if r["dataset"] == name)}
        for half, ev in evaluations.items():
            row[half] = next((r["f1"] for r in ev.datasets + ev.groups if r["dataset"] == name), None)
        rows.append(row)
    columns = [("dataset", "dataset"), ("questions", "n")] + [(h, f"F1 {h}") for h in halves]
    return render(rows, columns, f"Oracle study, F1 per dataset - {variant}")


def _report(result, title: str, folder: StudyFolder, halves, settings, reader, seed, out, output, quiet, questions, index,
            agent) -> None:
    upstream = []
    for half in halves:
        sidecar = folder.final(half).with_name(f"{half}.manifest.json")
        if sidecar.is_file():
            import orjson

            upstream.append(orjson.loads(sidecar.read_bytes()))
    options = {"halves": halves, "settings": {h: settings(h) for h in halves}}
    manifest = make_manifest("oracle", options, inputs=reader.hashes, seed=seed, upstream=upstream)
    variant = result.evaluations[ORACLE].summary()["variant_name"]
    rows_by_half = {h: ev.datasets + ev.groups for h, ev in result.evaluations.items()}
    write_png(str(folder.root / "oracle.png"), oracle_figure(rows_by_half, variant), manifest)
    seconds = {h: round(folder.seconds.get(h, 0.0), 1) for h in halves}
    context = [("questions file(s)", ", ".join(f"`{q}`" for q in questions)), ("index", f"`{index}`"),
               ("agent", f"`{agent}`"), ("halves", ", ".join(halves)),
               ("rollout wall time per half (s)", ", ".join(f"{h} {s}" for h, s in seconds.items()))]
    report = report_markdown(result, title=title, context=context, figure="oracle.png")
    (folder.root / "report.md").write_text(report)
    summary = {"kind": "oracle-study", "title": title, "variant_name": variant, "table1": result.table,
               "datasets": {h: ev.datasets + ev.groups for h, ev in result.evaluations.items()},
               "seconds": seconds, "manifest": manifest}
    write_json_atomic(folder.root / "summary.json", summary)
    if not quiet:
        show(per_dataset_table(result.evaluations, variant))
        show(table1(result.table, variant))
        stderr.print(f"report: {Path(out) / 'report.md'}, figure: {Path(out) / 'oracle.png'}")
    write_summary(output, summary)


def _pct(value: float | None) -> str | None:
    return None if value is None else f"{value:+.1%}"


def _signed(value: float | None) -> str | None:
    return None if value is None else f"{value:+.3f}"

