"""Held-out ranker quality on fixed calls: two rankers judged on exactly the same sub-queries and candidates.

The ranker calls of two runs differ (the agent writes other sub-queries), so Hit@k of two runs' own calls
compares different questions asked of the rankers. Here the calls recorded in one evaluation rollout file
(sub-query, question, the retriever's candidates in its order, candidate_has_answer) are given again to any
ranker model, with the rollout's own prompt, decoding constraint and parsing (`rollout.rank_llm`), greedy,
and its output is scored:

- Hit@1: the first passage it puts first holds a gold answer (DPR has_answer, as recorded by the rollout).
- nDCG@K, K the call's k: binary relevance = candidate_has_answer,
  DCG = sum over the K chosen positions i (0-based) of rel_i / log2(i + 2), divided by the DCG of the best
  possible choice (min(K, number of answer-bearing candidates) of them first).
- Only calls with at least one answer-bearing candidate count for these two (no order can score on the
  others); how many there are is reported. Calls without candidates (nothing retrieved) are skipped and
  counted apart.
- An invalid output counts as what the rollout would have shown: the retriever's top-K (or, for runs made
  with --lenient-ranker, the repaired ranking), and is counted.
- The retriever's own order (the first K candidates: what `--ranker none` shows) is scored on the same calls.

Figures per dataset pool its counted calls; single-hop, multi-hop and average are unweighted means over the
datasets present, as in cosearch_cli/evaluate.py. Differences between two orders on the same calls get a
paired cluster bootstrap (evaluate.paired_bootstrap with weights): questions are resampled within each
dataset and a question's calls move together. A dataset with a single scored question contributes no spread
(every replicate redraws that question), so its difference enters the interval as if it were exact:
`quality()` names such datasets (`thin_datasets`) so a report can say so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from cosearch_cli import ranker as ranking
from cosearch_cli.errors import InputError
from cosearch_cli.evaluate import DATASETS, group_rows, paired_bootstrap
from cosearch_cli.records import Question, RankerCall, RolloutRecord
from cosearch_cli.rollout import RolloutConfig, RolloutStats, rank_llm, ranker_constraint_factory

METRICS = ("hit1", "ndcg")
# Rollout settings that shape a ranker call; read back from the records so a re-run asks what the rollout asked.
_RANKER_SETTINGS = ("k", "ranker_max_new_tokens", "ranker_passage_tokens", "lenient_ranker", "seed")


def hit_at_1(has_answer: Sequence[bool], order: Sequence[int]) -> float:
    """1.0 when the passage put first holds a gold answer."""
    return float(bool(order) and has_answer[order[0]])


def ndcg_at_k(has_answer: Sequence[bool], order: Sequence[int], k: int) -> float:
    """Binary-relevance nDCG of the first k of `order` against the best k of all candidates (0 if none hold
    an answer)."""
    dcg = sum(1.0 / math.log2(i + 2) for i, c in enumerate(order[:k]) if has_answer[c])
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(k, sum(map(bool, has_answer)))))
    return dcg / ideal if ideal else 0.0


@dataclass
class CallScore:
    """One order of one recorded call, scored."""

    call_id: str
    question_id: str
    dataset: str
    k: int
    permutation: list[int]  # 0-based candidate indices, best first (what the agent would see)
    valid: bool
    answer_candidates: int  # candidates holding a gold answer (0: the call does not count)
    hit1: float | None  # None when the call does not count
    ndcg: float | None
    error: str | None = None
    output_text: str = ""


def score_order(record: RolloutRecord, call: RankerCall, permutation: Sequence[int], k: int, *, valid: bool = True,
                error: str | None = None, output_text: str = "") -> CallScore:
    answers = sum(map(bool, call.candidate_has_answer))
    counted = answers > 0
    return CallScore(call_id=call.id, question_id=record.question_id, dataset=record.dataset, k=k,
                     permutation=list(permutation), valid=valid, answer_candidates=answers,
                     hit1=hit_at_1(call.candidate_has_answer, permutation) if counted else None,
                     ndcg=ndcg_at_k(call.candidate_has_answer, permutation, k) if counted else None,
                     error=error, output_text=output_text)


# ---------------------------------------------------------------------------------------------------------
# The fixed calls


@dataclass
class FixedCalls:
    """The calls of one evaluation run that can be re-ranked, and the settings the rollout used for them."""

    pairs: list[tuple[RolloutRecord, RankerCall]]  # calls with candidates, in file order
    skipped_no_candidates: int
    config: RolloutConfig  # the rollout's ranker settings, greedy

    @property
    def k(self) -> int:
        return self.config.k

    def questions(self) -> int:
        return len({record.question_id for record, _ in self.pairs})


def fixed_calls(records: Sequence[RolloutRecord]) -> FixedCalls:
    """Every ranker call of the run that has candidates; the rollout's ranker settings, checked to be one set."""
    if not records:
        raise InputError("no rollout records to take ranker calls from", fix="pass the output of `cosearch rollout`")
    settings = {}
    for key in _RANKER_SETTINGS:
        values = {repr(r.sampling[key]) for r in records if key in r.sampling}
        if len(values) > 1:
            raise InputError(f"the records were made with different {key!r} ({sorted(values)})",
                             fix="take the calls of one rollout run (one set of options)")
        if values:
            settings[key] = next(r.sampling[key] for r in records if key in r.sampling)
    config = replace(RolloutConfig(), ranker="llm", greedy=True, **settings)
    pairs, skipped = [], 0
    for record in records:
        for call in record.ranker_calls:
            if call.candidate_ids:
                pairs.append((record, call))
            else:
                skipped += 1
    if not pairs:
        raise InputError(f"no ranker call with candidates in {len(records)} records ({skipped} without)",
                         fix="take the calls from an evaluation rollout in which the agent searched")
    return FixedCalls(pairs, skipped, config)


def retriever_scores(calls: FixedCalls) -> list[CallScore]:
    """The retriever's own order, the first K candidates (what `--ranker none` shows)."""
    return [score_order(record, call, ranking.top_k(len(call.candidate_ids), calls.k), calls.k)
            for record, call in calls.pairs]


def recorded_scores(calls: FixedCalls) -> list[CallScore]:
    """What the run's own ranker chose on these calls (its recorded permutation)."""
    return [score_order(record, call, call.permutation, calls.k, valid=call.valid, error=call.error,
                        output_text=call.output_text) for record, call in calls.pairs]


def check_passages(calls: FixedCalls, passages: dict) -> None:
    """The index must be the one the calls were retrieved from: the passages must still hold the answers the
    rollout found in them."""
    from cosearch_cli.metrics import ANSWER_CONTAINMENT, has_answer, passage_has_answer

    for record, call in calls.pairs:
        current = record.sampling.get("answer_containment") == ANSWER_CONTAINMENT
        for pid, recorded in zip(call.candidate_ids, call.candidate_has_answer):
            p = passages[pid]
            # rollouts that do not name their containment counted the title too
            found = passage_has_answer(p, record.answers) if current else has_answer(f"{p.title}\n{p.text}",
                                                                                      record.answers)
            if found != recorded:
                raise InputError(f"passage {pid!r} of call {call.id!r} does not match what the rollout recorded "
                                 f"(has_answer {recorded})", fix="pass the index the rollout searched (--index)")


def rerank(calls: FixedCalls, backend, docs, *, constrained: bool, batch: int = 16,
           on_progress: Callable[[int], None] | None = None) -> list[CallScore]:
    """Run a ranker model on the fixed calls exactly as the rollout would (prompt, constraint, parsing),
    greedy unless `calls.config` says otherwise (fixed_calls makes it greedy), and score its outputs. `docs` is
    an index's doc store (`.get(ids)`)."""
    unique = list(dict.fromkeys(pid for _, call in calls.pairs for pid in call.candidate_ids))
    passages = dict(zip(unique, docs.get(unique)))
    check_passages(calls, passages)
    config = replace(calls.config, ranker_constraint=ranker_constraint_factory(backend) if constrained else None)
    stats = RolloutStats()
    scores: list[CallScore] = []
    for start in range(0, len(calls.pairs), batch):
        chunk = calls.pairs[start:start + batch]
        fresh = [replace(call, ranker="llm", permutation=[], chosen_ids=[], valid=True, error=None, prompt_ids=[],
                         output_ids=[], logprobs=[], output_text="") for _, call in chunk]
        questions = [Question(record.question_id, record.question, record.answers, record.dataset)
                     for record, _ in chunk]
        rank_llm(fresh, questions, passages, backend, config, stats)
        scores += [score_order(record, call, call.permutation, calls.k, valid=call.valid, error=call.error,
                               output_text=call.output_text) for (record, _), call in zip(chunk, fresh)]
        if on_progress:
            on_progress(len(chunk))
    return scores


# ---------------------------------------------------------------------------------------------------------
# Summaries and paired comparisons


def quality(scores: Sequence[CallScore]) -> dict:
    """Hit@1 and nDCG@K per dataset (pooled over counted calls) and per group (unweighted over datasets)."""
    by_dataset: dict[str, list[CallScore]] = {}
    for s in scores:
        by_dataset.setdefault(s.dataset, []).append(s)
    rows = []
    for dataset, members in by_dataset.items():
        counted = [s for s in members if s.hit1 is not None]
        row = {"dataset": dataset, "questions": len({s.question_id for s in members}),
               "questions_with_answer": len({s.question_id for s in counted}), "calls": len(members),
               "calls_with_answer": len(counted), "invalid": sum(not s.valid for s in members)}
        for metric in METRICS:
            row[metric] = sum(getattr(s, metric) for s in counted) / len(counted) if counted else None
        rows.append(row)
    rows.sort(key=lambda r: DATASETS.index(r["dataset"]))
    groups = group_rows(rows, averaged=METRICS, summed=("questions", "questions_with_answer", "calls",
                                                         "calls_with_answer", "invalid"))
    return {"datasets": rows, "groups": groups, **{key: groups[-1][key] for key in
                                                   ("calls", "calls_with_answer", "invalid", *METRICS)},
            "thin_datasets": [r["dataset"] for r in rows if r["questions_with_answer"] == 1]}


def level_ci(scores: Sequence[CallScore], metric: str = "hit1", *, samples: int = 1000, seed: int = 0,
             confidence: float = 0.95) -> list[float] | None:
    """The bootstrap CI of one order's `metric` as `quality()` averages it (pooled over a dataset's counted
    calls, then the unweighted mean over datasets): whole questions resampled within each dataset, a question's
    calls together. None when no call counts."""
    per_call = [(s.dataset, s.question_id, getattr(s, metric)) for s in scores if getattr(s, metric) is not None]
    average = _cluster_bootstrap(per_call, samples=samples, seed=seed, confidence=confidence).get("average")
    return [average["ci_low"], average["ci_high"]] if average else None


def paired_difference(a: Sequence[CallScore], b: Sequence[CallScore], metric: str, *, samples: int = 1000,
                      seed: int = 0, confidence: float = 0.95) -> dict[str, dict]:
    """B - A of `metric` on the same calls, with a paired cluster-bootstrap CI per dataset and group.

    A question's value is its mean difference over its counted calls, its weight their number, so a
    dataset's difference is the mean over its calls while whole questions are resampled.
    """
    b_by_call = {s.call_id: s for s in b}
    if set(b_by_call) != {s.call_id for s in a}:
        raise InputError("the two rankings were made on different calls",
                         fix="score both rankers on the calls of one rollout file")
    per_call = [(sa.dataset, sa.question_id, getattr(b_by_call[sa.call_id], metric) - getattr(sa, metric))
                for sa in a if getattr(sa, metric) is not None]
    return _cluster_bootstrap(per_call, samples=samples, seed=seed, confidence=confidence)


def _cluster_bootstrap(per_call: Sequence[tuple[str, str, float]], **settings) -> dict[str, dict]:
    """paired_bootstrap over calls given as (dataset, question, value): a question's value is its mean over its
    calls and its weight their number ({} without calls)."""
    per_question: dict[tuple[str, str], list[float]] = {}
    for dataset, question, value in per_call:
        per_question.setdefault((dataset, question), []).append(value)
    values: dict[str, list[float]] = {}
    weights: dict[str, list[float]] = {}
    for (dataset, _), members in per_question.items():
        values.setdefault(dataset, []).append(sum(members) / len(members))
        weights.setdefault(dataset, []).append(len(members))
    if not values:
        return {}
    return paired_bootstrap({d: np.array(v) for d, v in values.items()},
                            weights={d: np.array(w) for d, w in weights.items()}, **settings)
