"""How much a ranker can change what the agent is shown, per retriever depth N (issue 14, target b).

    .venv/bin/python bench/ranker_room.py --exclude runs/study3/heldout.jsonl --exclude runs/study3/warmup.jsonl \
        --index indexes/dev-bm25 --per-dataset 400 --k 3 --depths 5 10 20 50 --out bench/results/ranker_room.md

A ranker picks K of the retriever's top N for the agent. It can show the agent a gold answer that the
retriever's own top K does not only when an answer-bearing candidate lies at ranks K+1..N. For dev questions
(none of an `--exclude` file, by id or normalised text; the first `--per-dataset` of each dataset in sha1
order), searched with their own text (the warmed-up agent's query), this counts per N the questions whose top K
show a gold answer within the ranker's `--passage-tokens` tokens of a candidate (DPR-style has_answer) and those
where only ranks K+1..N show one: the room a perfect ranker has over the retriever's order. Also per N: the
questions where the first answer-bearing candidate is not ranked first (the room for Hit@1). No model is loaded
(the tokenizer only).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from answerable_pool import excluded_keys, unseen  # noqa: E402
from evidence_in_view import answer_in_view  # noqa: E402
from learning_split import DATA  # noqa: E402
from results_io import load_average, write_results  # noqa: E402


def room(flags: list[bool], k: int, depth: int) -> dict:
    """One question's answer-bearing flags (retriever order) read at depth N: does the top K show an answer,
    does only K+1..N, and is an answer-bearing candidate within N but not first."""
    top = flags[:depth]
    return {"in_top_k": any(top[:k]), "only_beyond_k": not any(top[:k]) and any(top[k:]),
            "not_first": any(top) and not top[0]}


def markdown(figures: dict) -> str:
    lines = ["# Room for a ranker: answer-bearing candidates beyond the retriever's top K (issue 14)", "",
             f"Command: `{figures['command']}`. Load {figures['load_before']} before, {figures['load_after']} "
             "after (no model; timing not measured).", "",
             f"{figures['questions']} dev questions (none held out or warmed up on), each searched with its own "
             f"text; a candidate bears an answer when a gold answer lies within its first "
             f"{figures['passage_tokens']} tokens (what the ranker reads). K = {figures['k']}.", "",
             "| N | questions | top K shows an answer | only ranks K+1..N show one | share a ranker can add "
             "| answer-bearing candidate within N, not first |", "|---|---|---|---|---|---|"]
    for row in figures["depths"]:
        lines.append(f"| {row['n']} | {figures['questions']} | {row['in_top_k']} | {row['only_beyond_k']} "
                     f"| {row['only_beyond_k'] / figures['questions']:.1%} | {row['not_first']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exclude", action="append", default=[], help="question files never to draw from")
    parser.add_argument("--index", required=True)
    parser.add_argument("--data", type=Path, default=DATA, help="folder with dev/ (../shared/data)")
    parser.add_argument("--per-dataset", type=int, default=400)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--depths", type=int, nargs="+", default=[5, 10, 20, 50])
    parser.add_argument("--passage-tokens", type=int, default=32, help="tokens of a candidate the ranker reads")
    parser.add_argument("--out")
    args = parser.parse_args()

    from cosearch_cli.index.build import open_index
    from cosearch_cli.models import load_tokenizer

    before = load_average()
    seen = excluded_keys(args.exclude)
    tokenizer, index = load_tokenizer("smollm2"), open_index(args.index)
    retriever, deepest = index.retriever(), max(args.depths)
    questions = [q for path in sorted((args.data / "dev").glob("*.jsonl"))
                 for q in unseen(path, seen)[:args.per_dataset]]
    totals = {n: {"n": n, "in_top_k": 0, "only_beyond_k": 0, "not_first": 0} for n in args.depths}
    for start in range(0, len(questions), 64):
        batch = questions[start:start + 64]
        for q, hits in zip(batch, retriever.search([q.question for q in batch], deepest)):
            texts = [p.text for p in index.docs.get([h.id for h in hits])]
            flags = answer_in_view(tokenizer, [str(a) for a in q.answers], texts, args.passage_tokens)
            for n in args.depths:
                for key, value in room(flags, args.k, n).items():
                    totals[n][key] += value
    figures = {"command": "python bench/ranker_room.py " + " ".join(sys.argv[1:]), "load_before": before,
               "load_after": load_average(), "questions": len(questions), "k": args.k,
               "passage_tokens": args.passage_tokens, "depths": list(totals.values())}
    write_results(args.out, markdown(figures), figures)


if __name__ == "__main__":
    main()
