"""Did training help? Before-vs-after figures on held-out questions, each difference with a paired bootstrap CI.

`compare_runs` takes the greedy evaluation rollouts of the models before and after training (the same
questions) and, for the ranker, the scores of both ranker models on one set of fixed calls
(cosearch_cli/ranker_quality.py), and returns the figures of a learning-evidence report:

- agent: F1 and EM averaged over datasets (evaluate.evaluate), after - before with the paired bootstrap of
  `evaluate.compare` (questions resampled within datasets);
- ranker: Hit@1 and nDCG@K of each ranker's own output on the same calls, after - before, and each ranker
  against the retriever's own order, with the paired cluster bootstrap (a question's calls move together).

All intervals come from one implementation, `evaluate.paired_bootstrap`, with one seed.
"""

from __future__ import annotations

from collections.abc import Sequence

from cosearch_cli.evaluate import compare, evaluate
from cosearch_cli.ranker_quality import CallScore, FixedCalls, paired_difference, quality, retriever_scores
from cosearch_cli.records import RolloutRecord


def _ci(stats: dict) -> list[float] | None:
    return [stats["ci_low"], stats["ci_high"]] if stats else None


def compare_runs(before: Sequence[RolloutRecord], after: Sequence[RolloutRecord], *,
                 calls: FixedCalls | None = None, ranker_before: Sequence[CallScore] | None = None,
                 ranker_after: Sequence[CallScore] | None = None, samples: int = 1000, seed: int = 0,
                 confidence: float = 0.95, yes_no_rule: bool = False) -> dict:
    """The report's figures. Without `calls` the ranker figures are None. With `calls`, a ranker given as None
    is the retriever's own order (a run without an LLM ranker, e.g. search-r1, shows the retriever's top-K)."""
    settings = dict(samples=samples, seed=seed, confidence=confidence)
    agent = compare(evaluate(before, yes_no_rule=yes_no_rule), evaluate(after, yes_no_rule=yes_no_rule),
                    **settings)
    average = next(row for row in agent.differences if row["dataset"] == "average")
    out = {"questions": average["questions"]}
    for metric in ("f1", "em"):
        out[f"agent_{metric}_before"] = average[f"{metric}_a"]
        out[f"agent_{metric}_after"] = average[f"{metric}_b"]
        out[f"agent_{metric}_gain"] = average[f"{metric}_diff"]
        out[f"agent_{metric}_gain_ci"] = [average[f"{metric}_ci_low"], average[f"{metric}_ci_high"]]
    out["agent_searches_before"] = agent.a.group("average")["searches"]
    out["agent_searches_after"] = agent.b.group("average")["searches"]
    out.update(_ranker_figures(calls, ranker_before, ranker_after, settings))
    out["bootstrap"] = settings | {
        "agent": "questions resampled within each dataset, paired; groups are means over datasets",
        "ranker": "questions resampled within each dataset, paired; a question's calls together"}
    return out


def _ranker_figures(calls: FixedCalls | None, ranker_before: Sequence[CallScore] | None,
                    ranker_after: Sequence[CallScore] | None, settings: dict) -> dict:
    keys = ("ranker_hit1_before", "ranker_hit1_after", "ranker_hit1_gain", "ranker_hit1_gain_ci",
            "ranker_ndcg_before", "ranker_ndcg_after", "ranker_ndcg_gain", "ranker_ndcg_gain_ci", "retriever_hit1",
            "retriever_ndcg", "ranker_vs_retriever", "ranker_vs_retriever_ci", "ranker_before_vs_retriever",
            "ranker_before_vs_retriever_ci", "ranker_counts")
    if calls is None:
        return dict.fromkeys(keys)
    retriever = retriever_scores(calls)
    ranker_before = retriever if ranker_before is None else ranker_before
    ranker_after = retriever if ranker_after is None else ranker_after
    q_before, q_after, q_retriever = quality(ranker_before), quality(ranker_after), quality(retriever)
    out = {}
    for metric in ("hit1", "ndcg"):
        gain = paired_difference(ranker_before, ranker_after, metric, **settings).get("average", {})
        out[f"ranker_{metric}_before"], out[f"ranker_{metric}_after"] = q_before[metric], q_after[metric]
        out[f"ranker_{metric}_gain"], out[f"ranker_{metric}_gain_ci"] = gain.get("diff"), _ci(gain)
        out[f"retriever_{metric}"] = q_retriever[metric]
    for name, scores in (("ranker_vs_retriever", ranker_after), ("ranker_before_vs_retriever", ranker_before)):
        stats = paired_difference(retriever, scores, "hit1", **settings).get("average", {})
        out[name], out[f"{name}_ci"] = stats.get("diff"), _ci(stats)
    out["ranker_counts"] = {"questions": calls.questions(), "calls": len(calls.pairs),
                            "calls_with_answer": q_retriever["calls_with_answer"],
                            "skipped_no_candidates": calls.skipped_no_candidates, "k": calls.k,
                            "invalid_before": q_before["invalid"], "invalid_after": q_after["invalid"],
                            "thin_datasets": q_retriever["thin_datasets"]}
    assert set(out) == set(keys), "every ranker figure is named in `keys`"
    return out
