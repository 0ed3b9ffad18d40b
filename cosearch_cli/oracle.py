"""The oracle-retrieval study (CoSearch Table 1): how much better would the agent answer with a perfect ranker?

The same questions run once per ranker ("halves": e.g. `none`, `llm`) and once with the `oracle` ranker, which
promotes answer-bearing candidates to the top of the K shown (cosearch_cli.ranker.oracle). Everything else is
equal: agent, index, settings and seeds (every row's seed derives from the base seed and the question id, so
the first search of a question is the same in every half). The relative gap is
(oracle average F1 - standard average F1) / standard average F1.

Resume: each half is kept in the study folder as `<half>.partial.jsonl`, one line appended (and flushed to
disk) per finished question, and becomes `<half>.jsonl` (with its manifest) once all questions are done. A
finished half is never recomputed; an interrupted one continues with the questions it lacks. The oracle half
does not depend on the standard ranker, so studies of several rankers in one folder share it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from cosearch_cli.artifacts import Writer, dumps, manifest_path, write_bytes_atomic, write_json_atomic
from cosearch_cli.errors import ConfigError, RecordError
from cosearch_cli.evaluate import Comparison, Evaluation, compare, evaluate
from cosearch_cli.records import Question, RolloutRecord, read_rollout

ORACLE = "oracle"
STANDARD_RANKERS = ("none", "llm")
TABLE1_GROUPS = ("single-hop", "multi-hop", "average")
# Paper Table 1 (token F1: single-hop, multi-hop, average; relative gap of the average).
PAPER_TABLE1 = {
    "7B": {"standard": (0.600, 0.506, 0.546), "oracle": (0.709, 0.564, 0.626), "gap": 0.147},
    "3B": {"standard": (0.531, 0.371, 0.440), "oracle": (0.636, 0.499, 0.558), "gap": 0.268},
}

RolloutFn = Callable[[str, list[Question]], Iterable[RolloutRecord]]


def study_halves(rankers: Sequence[str]) -> list[str]:
    """The standard rankers asked for, in order and without repeats, then the oracle."""
    halves: list[str] = []
    for ranker in rankers:
        if ranker not in STANDARD_RANKERS:
            raise ConfigError(f"--ranker {ranker!r} is not a standard ranker to compare with the oracle",
                              fix=f"use {' or '.join(STANDARD_RANKERS)} (the oracle half always runs)")
        if ranker not in halves:
            halves.append(ranker)
    if not halves:
        raise ConfigError("no ranker to compare with the oracle", fix="pass --ranker none and/or --ranker llm")
    return halves + [ORACLE]


# ---------------------------------------------------------------------------------------------------------
# The study folder


@dataclass
class StudyFolder:
    """Where a study's halves live: settings, finished halves, partial halves and time spent per half."""

    root: Path
    seconds: dict[str, float] = field(default_factory=dict)
    unrecorded: dict[str, dict] = field(default_factory=dict)  # settings written with a half's first result

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        times = self.root / "seconds.json"
        if times.is_file():
            self.seconds = orjson.loads(times.read_bytes())

    def final(self, half: str) -> Path:
        return self.root / f"{half}.jsonl"

    def partial(self, half: str) -> Path:
        return self.root / f"{half}.partial.jsonl"

    def settings_file(self, half: str) -> Path:
        return self.root / f"{half}.settings.json"

    def check_settings(self, half: str, settings: dict) -> None:
        """Refuse to continue a half that was started with other settings (its numbers would mix)."""
        path = self.settings_file(half)
        if half in self.unrecorded:
            recorded = self.unrecorded[half]
        elif not path.is_file():
            if self.final(half).exists() or self.partial(half).exists():
                raise ConfigError(f"{half} rollouts in {self.root} have no recorded settings",
                                  fix="pass --overwrite to recompute, or use another --out folder")
            self.unrecorded[half] = settings  # recorded with the first result: a failed start leaves nothing
            return
        else:
            recorded = orjson.loads(path.read_bytes())
        if recorded != settings:
            keys = sorted(k for k in set(recorded) | set(settings) if recorded.get(k) != settings.get(k))
            raise ConfigError(f"the {half} half in {self.root} was run with other settings ({', '.join(keys)})",
                              fix="pass --overwrite to recompute it, or use another --out folder")

    def remove(self, half: str) -> None:
        for path in (self.final(half), manifest_path(self.final(half)), self.partial(half), self.settings_file(half)):
            path.unlink(missing_ok=True)
        self.seconds.pop(half, None)
        self.unrecorded.pop(half, None)
        self._save_seconds()

    def load_final(self, half: str) -> list[RolloutRecord] | None:
        path = self.final(half)
        if not path.is_file():
            return None
        return [read_rollout(orjson.loads(line), str(path), i)
                for i, line in enumerate(path.read_bytes().splitlines(), start=1) if line.strip()]

    def load_partial(self, half: str) -> dict[str, RolloutRecord]:
        """Questions already finished in an interrupted half; a torn last line (killed mid-write) is dropped."""
        path = self.partial(half)
        if not path.is_file():
            return {}
        done: dict[str, RolloutRecord] = {}
        lines = path.read_bytes().split(b"\n")
        for i, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                data = orjson.loads(line)
            except orjson.JSONDecodeError:
                if i == len(lines):  # only the very last line may be torn
                    break
                raise RecordError("not valid JSON in the middle of a partial half", path=path, line=i,
                                  fix="delete this file (or pass --overwrite) to recompute the half") from None
            record = read_rollout(data, str(path), i)
            done[record.question_id] = record
        # Rewrite without the torn tail so that appends start on a fresh line.
        write_bytes_atomic(path, b"".join(dumps(r) for r in done.values()))
        return done

    def _record_settings(self, half: str) -> None:
        if half in self.unrecorded:
            write_json_atomic(self.settings_file(half), self.unrecorded.pop(half))

    def append(self, half: str, record: RolloutRecord, seconds: float) -> None:
        self._record_settings(half)
        with open(self.partial(half), "ab") as handle:
            handle.write(dumps(record))
            handle.flush()
            os.fsync(handle.fileno())
        self.seconds[half] = self.seconds.get(half, 0.0) + seconds
        self._save_seconds()

    def finish(self, half: str, records: list[RolloutRecord], manifest: dict) -> None:
        self._record_settings(half)
        manifest = manifest | {"wall_seconds": round(self.seconds.get(half, 0.0), 1)}
        with Writer(self.final(half)) as out:
            out.write_all(records)
            out.manifest = manifest
        self.partial(half).unlink(missing_ok=True)

    def _save_seconds(self) -> None:
        write_json_atomic(self.root / "seconds.json", self.seconds)


# ---------------------------------------------------------------------------------------------------------
# Running


def interleave(questions: Sequence[Question]) -> list[Question]:
    """Round-robin over datasets (in order of first appearance), so a partial study covers all of them evenly."""
    by_dataset: dict[str, list[Question]] = {}
    for q in questions:
        by_dataset.setdefault(q.dataset, []).append(q)
    longest = max((len(v) for v in by_dataset.values()), default=0)
    return [qs[i] for i in range(longest) for qs in by_dataset.values() if i < len(qs)]


def extend_half(half: str, questions: Sequence[Question], folder: StudyFolder, rollouts: RolloutFn,
                clock: Callable[[], float]) -> dict[str, RolloutRecord]:
    """Roll out the questions this half still lacks, appending each to its partial file as it finishes."""
    done = folder.load_partial(half)
    wanted = {q.id for q in questions}
    todo = [q for q in questions if q.id not in done]
    started = clock()
    for record in rollouts(half, todo) if todo else ():
        assert record.question_id in wanted, f"rollout returned an unexpected question {record.question_id!r}"
        now = clock()
        folder.append(half, record, now - started)
        started = now
        done[record.question_id] = record
    return done


def run_half(half: str, questions: Sequence[Question], folder: StudyFolder, rollouts: RolloutFn,
             manifest: Callable[[str], dict], clock: Callable[[], float]) -> list[RolloutRecord]:
    """Finish one half: reuse it if finished, else roll out only the questions it still lacks."""
    finished = folder.load_final(half)
    if finished is not None:
        return finished
    done = extend_half(half, questions, folder, rollouts, clock)
    missing = [q.id for q in questions if q.id not in done]
    assert not missing, f"rollout finished without questions {missing[:3]}"
    records = [done[q.id] for q in questions]
    folder.finish(half, records, manifest(half))  # made at the end: it names what the run loaded
    return records


def pending_halves(halves: Sequence[str], folder: StudyFolder) -> list[str]:
    """Halves that still need rollouts (so models are loaded only when something is left to do)."""
    return [h for h in halves if not folder.final(h).is_file()]


def run_study(questions: Sequence[Question], halves: Sequence[str], folder: StudyFolder, rollouts: RolloutFn,
              manifests: Callable[[str], dict], clock: Callable[[], float], *, block: int = 0
              ) -> dict[str, list[RolloutRecord]]:
    """Run every half. With `block` > 0 the halves advance together, `block` questions at a time, so that an
    interrupted study already holds paired results (see `finished_in_every_half`)."""
    if block > 0:
        # The oracle right after the first ranker: the first pair of halves completes earliest.
        order = [h for h in halves[:1] if h != ORACLE] + [ORACLE] + [h for h in halves[1:] if h != ORACLE]
        for end in range(block, len(questions), block):
            for half in pending_halves(order, folder):
                extend_half(half, questions[:end], folder, rollouts, clock)
    return {half: run_half(half, questions, folder, rollouts, manifests, clock) for half in halves}


def finished_in_every_half(questions: Sequence[Question], halves: Sequence[str], folder: StudyFolder
                           ) -> dict[str, list[RolloutRecord]]:
    """The records of the questions that every half has finished (finished or partial), in question order."""
    done = {}
    for half in halves:
        final = folder.load_final(half)
        done[half] = {r.question_id: r for r in final} if final is not None else folder.load_partial(half)
    common = [q.id for q in questions if all(q.id in d for d in done.values())]
    return {half: [done[half][qid] for qid in common] for half in halves}


# ---------------------------------------------------------------------------------------------------------
# Table 1 and the report


def relative_gap(standard: float | None, oracle: float | None) -> float | None:
    if standard is None or oracle is None or standard == 0:
        return None
    return (oracle - standard) / standard


@dataclass
class StudyResult:
    evaluations: dict[str, Evaluation]
    comparisons: dict[str, Comparison]  # standard half -> comparison (A = that half, B = oracle)
    table: list[dict]


def summarize(records: dict[str, list[RolloutRecord]], *, yes_no_rule: bool = False, bootstrap: int = 1000,
              seed: int = 0) -> StudyResult:
    """Evaluate every half and build Table 1's shape: single-hop, multi-hop, average F1 and the gaps."""
    evaluations = {half: evaluate(recs, yes_no_rule=yes_no_rule) for half, recs in records.items()}
    oracle = evaluations[ORACLE]
    comparisons = {half: compare(ev, oracle, samples=bootstrap, seed=seed)
                   for half, ev in evaluations.items() if half != ORACLE}
    table = []
    for half, ev in evaluations.items():
        row = {"ranker": half, "questions": len(ev.questions)}
        for group in TABLE1_GROUPS:
            row[group] = ev.group(group)["f1"]
        if half != ORACLE:
            for group in TABLE1_GROUPS:
                row[f"gap {group}"] = relative_gap(row[group], oracle.group(group)["f1"])
            avg = next(d for d in comparisons[half].differences if d["dataset"] == "average")
            row["oracle - this (avg F1)"] = avg["f1_diff"]
            row["ci_low"], row["ci_high"] = avg["f1_ci_low"], avg["f1_ci_high"]
        table.append(row)
    return StudyResult(evaluations, comparisons, table)


def _num(value: float | None, pct: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value:+.1%}" if pct else f"{value:.3f}"


def table1_markdown(table: Sequence[dict]) -> str:
    lines = ["| ranker | single-hop F1 | multi-hop F1 | average F1 | relative gap (avg) | oracle - ranker, avg F1 "
             "[95% CI] |", "|---|---|---|---|---|---|"]
    for row in table:
        if row["ranker"] == ORACLE:
            extra = "| | |"
        else:
            extra = (f"| {_num(row['gap average'], pct=True)} | {row['oracle - this (avg F1)']:+.3f} "
                     f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}] |")
        lines.append(f"| {row['ranker']} | {_num(row['single-hop'])} | {_num(row['multi-hop'])} | "
                     f"{_num(row['average'])} {extra}")
    return "\n".join(lines)


def datasets_markdown(evaluations: dict[str, Evaluation]) -> str:
    names = [r["dataset"] for r in next(iter(evaluations.values())).datasets]
    head = ("| ranker | " + " | ".join(names)
            + " | searches | fmt fail | Hit@1 | Hit@5 | no cands | invalid | ans in cands |")
    lines = [head, "|" + "---|" * (len(names) + 8)]
    for half, ev in evaluations.items():
        f1 = {r["dataset"]: r["f1"] for r in ev.datasets}
        avg = ev.group("average")
        cells = [_num(f1.get(n)) for n in names] + [_num(avg[k]) for k in (
            "searches", "format_fail", "hit@1", "hit@5", "no_candidates", "invalid", "answer_in_candidates")]
        lines.append(f"| {half} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paper_comparison(table: Sequence[dict]) -> str:
    ours = ", ".join(f"{_num(r['gap average'], pct=True)} with `--ranker {r['ranker']}`"
                     for r in table if r["ranker"] != ORACLE)
    paper = ", ".join(f"{v['gap']:+.1%} ({k} agent)" for k, v in PAPER_TABLE1.items())
    return f"Relative gap of the average F1 here: {ours}. Paper Table 1: {paper}."


def report_markdown(result: StudyResult, *, title: str, context: Sequence[tuple[str, str]], figure: str | None
                    ) -> str:
    """The study's report: settings, Table 1's shape, per-dataset F1, and the comparison with the paper."""
    variant = result.evaluations[ORACLE].summary()["variant_name"]
    counts = {r["dataset"]: r["questions"] for r in result.evaluations[ORACLE].datasets}
    parts = [f"# {title}", ""]
    parts += [f"- {key}: {value}" for key, value in context]
    parts += [f"- questions: {sum(counts.values())} ({', '.join(f'{d} {n}' for d, n in counts.items())})",
              f"- metric: {variant}; a question scores the mean over its trajectories; groups are unweighted "
              "means over datasets", "", "## Table 1 shape (token F1)", "", table1_markdown(result.table), "",
              paper_comparison(result.table), "", "## Per dataset (token F1) and averages over datasets", "",
              datasets_markdown(result.evaluations), ""]
    if figure:
        parts += [f"![F1 per dataset]({figure})", ""]
    return "\n".join(parts)

