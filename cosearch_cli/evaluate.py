"""Scoring rollouts the way the papers report them, and comparing two runs question by question.

How a number is made (also in README.md):
- A trajectory scores EM, SubEM and token F1 of its final answer (metrics.answer_scores; no answer = 0).
- A question scores the mean over its trajectories (G sampled rollouts; a greedy run has one), so every
  question weighs the same whatever G is. Search turns and format failures are averaged the same way.
- A dataset scores the mean over its questions. Ranker figures are pooled over the dataset's ranker calls:
  Hit@k = share of calls whose first k chosen passages include one that contains a gold answer
  (DPR has_answer, recorded by the rollout as candidate_has_answer); no_candidates = share of calls whose
  sub-query retrieved nothing (no ranker ran; they show nothing, so they count as misses in Hit@k);
  invalid = share of invalid outputs among the calls that had candidates to rank.
- Single-hop (NQ, TriviaQA, PopQA), multi-hop (HotpotQA, 2Wiki, MuSiQue, Bamboogle) and the average are
  unweighted means over the datasets present, as in the paper's tables (e.g. Table 1's 7B average
  .546 = (3 x .600 + 4 x .506) / 7).
- The metric variant (HotpotQA yes/no rule, the ranker parse mode the rollout recorded) is named in every
  output, so two tables made differently are never silently compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import orjson

from cosearch_cli.artifacts import Row
from cosearch_cli.errors import InputError, RecordError
from cosearch_cli.metrics import answer_scores
from cosearch_cli.records import RolloutRecord, read_rollout

SINGLE_HOP = ("nq", "triviaqa", "popqa")
MULTI_HOP = ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
DATASETS = SINGLE_HOP + MULTI_HOP
HITS_AT = (1, 3, 5)
ANSWER_METRICS = ("em", "f1", "subem")
GROUPS = (("single-hop", SINGLE_HOP), ("multi-hop", MULTI_HOP), ("average", DATASETS))
# Keys a rollout may record in `sampling` that change what the ranker figures mean.
_RANKER_PARSE_KEYS = ("lenient_ranker", "ranker_parse")


def hop_of(dataset: str) -> str:
    return "single" if dataset in SINGLE_HOP else "multi"


# ---------------------------------------------------------------------------------------------------------
# Reading a run


def read_run(rows: Iterable[Row]) -> list[RolloutRecord]:
    """Parse one run's rollout records, refusing unknown datasets and a question scored twice."""
    records: list[RolloutRecord] = []
    seen: dict[str, str] = {}
    for row in rows:
        record = read_rollout(row.data, row.path, row.line)
        if record.dataset not in DATASETS:
            raise RecordError(f"unknown dataset {record.dataset!r} for question {record.question_id!r}",
                              path=row.path, line=row.line,
                              fix=f"dataset must be one of {', '.join(DATASETS)}")
        where = f"{row.path}:{row.line}"
        if record.question_id in seen:
            raise RecordError(f"question {record.question_id!r} appears twice (first at {seen[record.question_id]})",
                              path=row.path, line=row.line,
                              fix="evaluate each run once; shards of one run must not overlap")
        seen[record.question_id] = where
        records.append(record)
    return records


def metric_variant(records: Sequence[RolloutRecord], *, yes_no_rule: bool) -> dict:
    """The choices that change the numbers: named in every table, summary, figure and manifest."""
    parse_modes = set()
    for record in records:
        for key in _RANKER_PARSE_KEYS:
            if key in record.sampling:
                value = record.sampling[key]
                parse_modes.add(("lenient" if value else "strict") if isinstance(value, bool) else str(value))
                break
        else:
            parse_modes.add("unrecorded")
    rankers = sorted({call.ranker for record in records for call in record.ranker_calls})
    settings = {orjson.dumps(r.sampling, option=orjson.OPT_SORT_KEYS): r.sampling for r in records}
    return {
        "yes_no_rule": yes_no_rule,
        "ranker_parse": "+".join(sorted(parse_modes)) or "unrecorded",
        "rankers": rankers,
        "rollout_settings": list(settings.values()),  # the distinct `sampling` dicts the rollouts recorded
    }


def variant_name(variant: dict) -> str:
    yes_no = "HotpotQA yes/no rule on" if variant["yes_no_rule"] else "yes/no rule off"
    rankers = ",".join(variant["rankers"]) or "no ranker calls"
    return f"token F1 ({yes_no}); ranker {rankers}, parse {variant['ranker_parse']}"


# ---------------------------------------------------------------------------------------------------------
# Per question


@dataclass
class QuestionScore:
    question_id: str
    dataset: str
    hop: str
    question: str
    answers: list[str]
    predictions: list[str | None]
    samples: int
    em: float
    f1: float
    subem: float
    searches: float
    format_ok: float  # share of trajectories that passed the format check
    ranker_calls: int
    empty_calls: int  # calls that retrieved no candidates: nothing was ranked
    invalid_calls: int  # invalid outputs among the calls with candidates
    calls_with_answer: int  # calls where some candidate contains a gold answer
    hits: dict[int, int] = field(default_factory=dict)  # k -> calls whose top-k chosen hold an answer

    def row(self) -> dict:
        """A flat row for the per-question table; Hit@k is this question's share of calls (None: no calls)."""
        data = asdict(self)
        hits = data.pop("hits")
        for k in HITS_AT:
            data[f"hit@{k}"] = hits[k] / self.ranker_calls if self.ranker_calls else None
        return data


def chosen_has_answer(call) -> list[bool]:
    """has_answer of the chosen passages, in the order the ranker put them."""
    return [call.candidate_has_answer[i] for i in call.permutation]


def score_question(record: RolloutRecord, *, yes_no_rule: bool = False) -> QuestionScore:
    trajectories = record.trajectories
    if not trajectories:
        raise RecordError(f"question {record.question_id!r} has no trajectories",
                          fix="regenerate the run with `cosearch rollout`")
    per_traj = [answer_scores(t.answer, record.answers, yes_no_rule=yes_no_rule) for t in trajectories]
    n = len(trajectories)
    hits = {k: 0 for k in HITS_AT}
    for call in record.ranker_calls:
        chosen = chosen_has_answer(call)
        for k in HITS_AT:
            hits[k] += any(chosen[:k])
    return QuestionScore(
        question_id=record.question_id,
        dataset=record.dataset,
        hop=hop_of(record.dataset),
        question=record.question,
        answers=list(record.answers),
        predictions=[t.answer for t in trajectories],
        samples=n,
        em=sum(s["em"] for s in per_traj) / n,
        f1=sum(s["f1"] for s in per_traj) / n,
        subem=sum(s["subem"] for s in per_traj) / n,
        searches=sum(t.n_searches for t in trajectories) / n,
        format_ok=sum(t.format_ok for t in trajectories) / n,
        ranker_calls=len(record.ranker_calls),
        empty_calls=sum(c.no_candidates for c in record.ranker_calls),
        invalid_calls=sum(not c.valid and not c.no_candidates for c in record.ranker_calls),
        calls_with_answer=sum(c.any_has_answer for c in record.ranker_calls),
        hits=hits,
    )


# ---------------------------------------------------------------------------------------------------------
# Per dataset and groups


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def dataset_row(dataset: str, scores: Sequence[QuestionScore]) -> dict:
    calls = sum(s.ranker_calls for s in scores)
    row = {
        "dataset": dataset,
        "hop": hop_of(dataset),
        "questions": len(scores),
        "trajectories": sum(s.samples for s in scores),
    }
    for metric in ANSWER_METRICS:
        row[metric] = _mean([getattr(s, metric) for s in scores])
    row["searches"] = _mean([s.searches for s in scores])
    row["format_fail"] = 1.0 - _mean([s.format_ok for s in scores])
    row["ranker_calls"] = calls
    for k in HITS_AT:
        row[f"hit@{k}"] = sum(s.hits[k] for s in scores) / calls if calls else None
    empty = sum(s.empty_calls for s in scores)
    row["no_candidates"] = empty / calls if calls else None
    row["invalid"] = sum(s.invalid_calls for s in scores) / (calls - empty) if calls > empty else None
    row["answer_in_candidates"] = sum(s.calls_with_answer for s in scores) / calls if calls else None
    return row


_GROUP_AVERAGED = ANSWER_METRICS + ("searches", "format_fail") + tuple(f"hit@{k}" for k in HITS_AT) + (
    "no_candidates", "invalid", "answer_in_candidates")


def group_rows(dataset_rows: Sequence[dict], *, averaged: Sequence[str] = _GROUP_AVERAGED,
               summed: Sequence[str] = ("questions", "trajectories", "ranker_calls")) -> list[dict]:
    """Single-hop, multi-hop and average: unweighted means over the datasets present (None if none) of the
    `averaged` columns, totals of the `summed` ones."""
    out = []
    for name, members in GROUPS:
        rows = [r for r in dataset_rows if r["dataset"] in members]
        group = {"dataset": name, "hop": name, **{key: sum(r[key] for r in rows) for key in summed},
                 "datasets": len(rows)}
        for metric in averaged:
            group[metric] = _mean([r[metric] for r in rows if r[metric] is not None])
        out.append(group)
    return out


@dataclass
class Evaluation:
    questions: list[QuestionScore]
    datasets: list[dict]
    groups: list[dict]
    variant: dict

    def summary(self) -> dict:
        return {"kind": "evaluation", "variant": self.variant, "variant_name": variant_name(self.variant),
                "datasets": self.datasets, "groups": self.groups}

    def group(self, name: str) -> dict:
        return next(g for g in self.groups if g["dataset"] == name)


def evaluate(records: Sequence[RolloutRecord], *, yes_no_rule: bool = False) -> Evaluation:
    """Per-question scores, per-dataset rows in the paper's order, and the single/multi/average groups."""
    if not records:
        raise InputError("no rollout records to evaluate", fix="pass the output of `cosearch rollout`")
    scores = [score_question(r, yes_no_rule=yes_no_rule) for r in records]
    by_dataset: dict[str, list[QuestionScore]] = {}
    for s in scores:
        by_dataset.setdefault(s.dataset, []).append(s)
    datasets = [dataset_row(d, by_dataset[d]) for d in DATASETS if d in by_dataset]
    return Evaluation(scores, datasets, group_rows(datasets), metric_variant(records, yes_no_rule=yes_no_rule))


# ---------------------------------------------------------------------------------------------------------
# Comparing two runs


def paired_bootstrap(diffs: dict[str, np.ndarray], *, weights: dict[str, np.ndarray] | None = None,
                     samples: int = 1000, seed: int = 0, confidence: float = 0.95) -> dict[str, dict]:
    """Percentile CIs of the mean per-question difference, per dataset and for the dataset groups.

    Each replicate resamples questions with replacement *within* each dataset (the pairing is kept: a
    question's A and B scores move together), so the group figures are the same unweighted means over
    datasets as the tables, computed per replicate. Datasets are drawn in the fixed DATASETS order from one
    seeded generator, so the same seed gives the same intervals.

    `weights` (per question, positive) turn this into a cluster bootstrap of a pooled mean: with a question's
    mean difference over its n ranker calls as its value and n as its weight, a dataset's figure is
    sum(w * d) / sum(w), the mean over all its calls, while whole questions (all their calls together) are
    what is resampled, because the calls of one question are not independent of each other.
    """
    assert samples > 0, "bootstrap needs at least one replicate"
    rng = np.random.default_rng(seed)
    replicates: dict[str, np.ndarray] = {}
    point: dict[str, float] = {}
    for dataset in DATASETS:
        if dataset not in diffs:
            continue
        point[dataset], replicates[dataset] = _resampled_means(
            diffs[dataset], None if weights is None else weights[dataset], rng, samples, dataset)
    for name, members in GROUPS:
        present = [d for d in members if d in replicates]
        if present:
            replicates[name] = np.mean([replicates[d] for d in present], axis=0)
            point[name] = float(np.mean([point[d] for d in present]))
    tail = (1.0 - confidence) / 2 * 100
    out = {}
    for name, values in replicates.items():
        low, high = np.percentile(values, [tail, 100 - tail])
        out[name] = {"diff": point[name], "ci_low": float(low), "ci_high": float(high),
                     "share_positive": float(np.mean(values > 0))}
    return out


def _resampled_means(values, weights, rng: np.random.Generator, samples: int, name: str):
    """The (weighted) mean of `values` and its `samples` bootstrap replicates, resampling the values (whole
    questions) with replacement; with `weights`, each replicate is sum(w * v) / sum(w) of the drawn questions."""
    values = np.asarray(values, dtype=float)
    picks = rng.integers(0, len(values), size=(samples, len(values)))
    if weights is None:
        return float(np.mean(values)), values[picks].mean(axis=1)
    w = np.asarray(weights, dtype=float)
    assert w.shape == values.shape and (w > 0).all(), f"{name}: one positive weight per question"
    return float((values * w).sum() / w.sum()), (values * w)[picks].sum(axis=1) / w[picks].sum(axis=1)


def mean_ci(values: Sequence[float], weights: Sequence[float] | None = None, *, samples: int = 1000, seed: int = 0,
            confidence: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI of one run's mean over questions (not a difference): `values` one per question,
    and with `weights` (e.g. a question's count of trajectories or calls, `values` then its mean over them) the
    pooled mean over all of them, resampling whole questions. None without values."""
    if len(values) == 0:
        return None
    _, replicates = _resampled_means(values, weights, np.random.default_rng(seed), samples, "mean_ci")
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


@dataclass
class Comparison:
    a: Evaluation
    b: Evaluation
    questions: list[dict]  # per question: both runs' scores and B - A
    differences: list[dict]  # per dataset and group: A, B, B - A with its CI, for each answer metric
    bootstrap: dict

    def summary(self) -> dict:
        return {"kind": "comparison", "a": self.a.summary(), "b": self.b.summary(),
                "differences": self.differences, "bootstrap": self.bootstrap}


def check_same_questions(a: Evaluation, b: Evaluation) -> None:
    ids_a = {s.question_id for s in a.questions}
    ids_b = {s.question_id for s in b.questions}
    if ids_a == ids_b:
        return
    only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
    example = (only_a or only_b)[0]
    raise InputError(f"the two runs cover different questions: {len(only_a)} only in A, {len(only_b)} only in B "
                     f"(e.g. {example!r})", fix="compare runs made from the same question file (and --limit/--shard)")


def compare(a: Evaluation, b: Evaluation, *, samples: int = 1000, seed: int = 0,
            confidence: float = 0.95) -> Comparison:
    """B - A per question, and per dataset/group with a paired bootstrap CI (same seed, same CI)."""
    check_same_questions(a, b)
    b_by_id = {s.question_id: s for s in b.questions}
    questions = []
    diffs: dict[str, dict[str, list[float]]] = {m: {} for m in ANSWER_METRICS}
    for sa in sorted(a.questions, key=lambda s: s.question_id):  # the CI does not depend on the records' order
        sb = b_by_id[sa.question_id]
        row = {"question_id": sa.question_id, "dataset": sa.dataset, "hop": sa.hop, "question": sa.question}
        for metric in ANSWER_METRICS:
            va, vb = getattr(sa, metric), getattr(sb, metric)
            row[f"{metric}_a"], row[f"{metric}_b"], row[f"{metric}_diff"] = va, vb, vb - va
            diffs[metric].setdefault(sa.dataset, []).append(vb - va)
        row["searches_a"], row["searches_b"] = sa.searches, sb.searches
        questions.append(row)
    boot = {m: paired_bootstrap({d: np.array(v) for d, v in diffs[m].items()}, samples=samples, seed=seed,
                                confidence=confidence) for m in ANSWER_METRICS}
    rows_a = {r["dataset"]: r for r in a.datasets + a.groups}
    rows_b = {r["dataset"]: r for r in b.datasets + b.groups}
    differences = []
    for name in [r["dataset"] for r in a.datasets] + [g for g, _ in GROUPS]:
        if name not in boot["f1"]:
            continue
        row = {"dataset": name, "questions": rows_a[name]["questions"]}
        for metric in ANSWER_METRICS:
            stats = boot[metric][name]
            row[f"{metric}_a"], row[f"{metric}_b"] = rows_a[name][metric], rows_b[name][metric]
            row[f"{metric}_diff"] = stats["diff"]
            row[f"{metric}_ci_low"], row[f"{metric}_ci_high"] = stats["ci_low"], stats["ci_high"]
        differences.append(row)
    settings = {"samples": samples, "seed": seed, "confidence": confidence,
                "resampling": "questions within each dataset, paired"}
    return Comparison(a, b, questions, differences, settings)
