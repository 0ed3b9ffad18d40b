"""Does BM25's tie order since 9579ea2 change what the held-out agent was shown? (issue 14, studies 8-9)

    .venv/bin/python bench/bm25_tie_order.py --calls runs/s4-cosearch/eval-init/rollouts.jsonl \
        --index indexes/dev-bm25 --out bench/results/bm25_tie_order.md

`9579ea2` replaced bm25s's `BM25.retrieve` (argpartition over every score) with our own top-k over matched
passages, equal scores in row order. Both use the same scores, so they can differ only in the order (or, at the
k-th place, the choice) of passages with equal scores. This re-searches every ranker call's query of a
held-out evaluation both ways, with the call's N, and counts the candidate lists that differ, in order and as
sets, and those that differ from what the evaluation recorded. Writes the Markdown and its .json twin.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def compare(recorded: list[list[str]], current: list[list[str]], old: list[list[str]]) -> dict:
    """Counts of calls whose candidate lists differ: old vs current (order, set), recorded vs current (order)."""
    return {"calls": len(recorded),
            "old_vs_current_order": sum(a != b for a, b in zip(old, current)),
            "old_vs_current_set": sum(set(a) != set(b) for a, b in zip(old, current)),
            "recorded_vs_current_order": sum(a != b for a, b in zip(recorded, current))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", required=True, help="a held-out evaluation's rollouts.jsonl")
    parser.add_argument("--index", required=True, help="the BM25 index it searched")
    parser.add_argument("--out", required=True, type=Path, help="results Markdown (the .json twin beside it)")
    args = parser.parse_args()

    from cosearch_cli.index.bm25 import tokenize_queries
    from cosearch_cli.index.build import open_index

    retriever = open_index(args.index).retriever("bm25")
    calls = [c for line in Path(args.calls).open("rb") for c in orjson.loads(line)["ranker_calls"]]
    recorded, current, old = [], [], []
    for call in calls:
        n = len(call["candidate_ids"])
        recorded.append(call["candidate_ids"])
        current.append([hit.id for hit in retriever.search([call["query"]], n)[0]])
        tokens = tokenize_queries([call["query"]], retriever.stemmer, retriever.stopwords)
        rows, scores = retriever.model.retrieve(tokens, k=n, show_progress=False)  # the code before 9579ea2
        old.append(list(retriever.row_ids.take(rows[0][scores[0] > 0])))
    figures = {"command": "python bench/bm25_tie_order.py " + " ".join(sys.argv[1:]), **compare(recorded, current, old)}
    args.out.with_suffix(".json").write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))
    args.out.write_text(
        "# BM25's tie order before and after 9579ea2 on the held-out ranker calls (issue 14)\n\n"
        f"Command: `{figures['command']}` (no model; seconds). Twin: `{args.out.with_suffix('.json').name}`.\n\n"
        "Each held-out ranker call's query searched again with the call's N: with bm25s's `BM25.retrieve`, as "
        "before 9579ea2 (old), and with the current `BM25Retriever.search` (current).\n\n"
        "| calls | old vs current: order differs | old vs current: set differs | recorded vs current: order differs |\n"
        "|---|---|---|---|\n"
        f"| {figures['calls']} | {figures['old_vs_current_order']} | {figures['old_vs_current_set']} | "
        f"{figures['recorded_vs_current_order']} |\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
