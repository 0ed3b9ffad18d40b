"""How much of the evidence a prompt shows (issue 14, target b): of the ranker calls with an answer-bearing
candidate (DPR has_answer on the whole passage, the definition Hit@1 and the rewards use), in how many does
some candidate show the answer within the first B tokens of its text, the part a prompt cut to B tokens shows
(the ranker reads 32 tokens a candidate by default, the agent 48 a passage)?

    .venv/bin/python bench/evidence_in_view.py --index indexes/dev-bm25 \
        --calls runs/s4-cosearch/eval-init/rollouts.jsonl --questions runs/study3/warmup.jsonl \
        --questions runs/study7-split/warmup_more.jsonl --out bench/results/evidence_in_view.md

`--calls`: the ranker calls of a recorded run (the agent's own queries). `--questions`: the calls a warm-up
demonstrates (`cosearch warmup`'s first sub-query of each question, the retriever's top N). No model runs;
tokens are the embedded SmolLM2's.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from results_io import load_average, write_results  # noqa: E402

from cosearch_cli.answerable import answer_in_view as in_view  # noqa: E402
from cosearch_cli.metrics import has_answer  # noqa: E402

WHOLE = 0  # budget meaning "the whole passage"


def answer_in_view(tokenizer, answers: list[str], texts: list[str], budget: int) -> list[bool]:
    """Per candidate text: whether a gold answer lies within its first `budget` tokens (WHOLE: anywhere)."""
    return in_view(tokenizer, answers, texts, None if budget == WHOLE else budget)


def visibility(calls: list[tuple[list[str], list[str]]], tokenizer, budgets: list[int]) -> dict:
    """`calls`: (answers, candidate texts in retriever order) of calls with an answer-bearing candidate.
    Per budget: calls where some candidate shows an answer within it, answer-bearing candidates that show it,
    calls whose first candidate shows it."""
    out = {"calls_with_answer": len(calls), "answer_candidates": 0, "by_budget": {}}
    seen = {b: {"calls": 0, "candidates": 0, "first_candidate": 0} for b in budgets}
    for answers, texts in calls:
        out["answer_candidates"] += sum(has_answer(t, answers) for t in texts)
        for b in budgets:
            flags = answer_in_view(tokenizer, answers, texts, b)
            seen[b]["calls"] += any(flags)
            seen[b]["candidates"] += sum(flags)
            seen[b]["first_candidate"] += flags[0]
    for b in budgets:
        row = seen[b]
        row["call_share"] = round(row["calls"] / max(1, len(calls)), 3)
        row["candidate_share"] = round(row["candidates"] / max(1, out["answer_candidates"]), 3)
        out["by_budget"][str(b) if b else "whole"] = row
    return out


@dataclass
class RecordedCall:
    """One ranker call of a recorded run, with its candidates' texts."""

    id: str
    answers: list[str]
    texts: list[str]  # in the retriever's order
    answer_bearing: bool  # some candidate holds a gold answer (the record's own flags)
    ranker_passage_tokens: int | None  # what the rollout's ranker read


def recorded_calls(path: str, docs) -> list[RecordedCall]:
    """Every ranker call with candidates of a recorded run (rollouts.jsonl)."""
    from cosearch_cli.artifacts import Reader
    from cosearch_cli.evaluate import read_run

    return [RecordedCall(call.id, record.answers, [p.text for p in docs.get(call.candidate_ids)],
                         any(call.candidate_has_answer), record.sampling.get("ranker_passage_tokens"))
            for record in read_run(Reader.open(str(path)).rows())
            for call in record.ranker_calls if call.candidate_ids]


def demonstration_calls(paths: list[str], index, top_n: int) -> tuple[list, int]:
    from cosearch_cli.records import read_questions
    from cosearch_cli.rollout import RolloutConfig
    from cosearch_cli.warmup import sub_queries

    questions, _ = read_questions(paths)
    retriever = index.retriever(RolloutConfig().retriever)
    calls, total = [], 0
    for question in questions:
        queries = sub_queries(question)[:1]
        hits = retriever.search(queries, top_n)[0] if queries else []
        if not hits:
            continue
        total += 1
        texts = [p.text for p in index.docs.get([h.id for h in hits])]
        if any(has_answer(t, question.answers) for t in texts):
            calls.append((question.answers, texts))
    return calls, total


def markdown(command: str, figures: dict) -> str:
    lines = ["# How much of the evidence the prompts show (issue 14)", "",
             f"`{command}`. No model runs (SmolLM2's tokenizer only). Load before: {figures['load_before']}.", "",
             "Of the ranker calls with an answer-bearing candidate (has_answer on the whole passage text: what "
             "Hit@1, the ranker's reward and the warm-up's demonstrations count), the share in which a prompt that "
             "cuts each passage to B tokens still shows an answer. The ranker reads B = 32 tokens a candidate, "
             "the agent 48 a passage (`--sizes cpu`, the default; `--sizes paper`: 128 and 160).", ""]
    for name, block in figures["sets"].items():
        lines += [f"## {block['label']}", "",
                  f"{block['calls']} calls, {block['calls_with_answer']} with an answer-bearing candidate "
                  f"({block['answer_candidates']} such candidates).", "",
                  "| tokens shown per passage | calls showing an answer | answer-bearing candidates showing it "
                  "| calls whose first candidate shows it |", "|---|---|---|---|"]
        for budget, row in block["by_budget"].items():
            lines.append(f"| {budget} | {row['calls']} ({row['call_share']:.2f}) | {row['candidates']} "
                         f"({row['candidate_share']:.2f}) | {row['first_candidate']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", required=True)
    parser.add_argument("--calls", help="a recorded run's rollouts.jsonl")
    parser.add_argument("--questions", action="append", default=[], help="question files (warm-up calls)")
    parser.add_argument("--top-n", type=int, default=5)
    parser.add_argument("--budgets", type=int, nargs="+", default=[32, 48, 64, 96, 128, WHOLE])
    parser.add_argument("--out")
    args = parser.parse_args()

    from cosearch_cli.index import open_index
    from cosearch_cli.models import load_tokenizer

    before = load_average()
    tokenizer = load_tokenizer("smollm2")
    index = open_index(args.index)
    sets = {}
    if args.calls:
        recorded = recorded_calls(args.calls, index.docs)
        calls = [(c.answers, c.texts) for c in recorded if c.answer_bearing]
        sets["recorded"] = {"label": f"Recorded ranker calls ({args.calls})", "calls": len(recorded),
                            **visibility(calls, tokenizer, args.budgets)}
    if args.questions:
        calls, total = demonstration_calls(args.questions, index, args.top_n)
        sets["demonstrations"] = {"label": f"Warm-up calls ({', '.join(args.questions)}; first sub-query, "
                                           f"top {args.top_n})", "calls": total,
                                  **visibility(calls, tokenizer, args.budgets)}
    if not sets:
        parser.error("give --calls and/or --questions")
    command = "python bench/evidence_in_view.py " + " ".join(sys.argv[1:])
    figures = {"command": command, "load_before": before, "load_after": load_average(), "sets": sets}
    write_results(args.out, markdown(command, figures), figures)


if __name__ == "__main__":
    main()
