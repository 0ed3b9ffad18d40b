"""What the ranker chose in a run's training rollouts, iteration by iteration (issue 14, study 9).

    .venv/bin/python bench/ranker_choices.py runs/s9-cosearch [--json out.json]

Held-out Hit@1 moves only when the greedy ranker's first choice changes; this shows whether the sampled ranker
was moving towards such a change. Per iteration, over the ranker calls of its training rollouts
(`iter-*/rollouts.jsonl`): calls; calls whose first choice is not the retriever's first candidate; calls with
room (some candidate bears a gold answer, the retriever's first does not); of those, calls whose first choice
bears one; the ranker's Hit@1 over calls with any answer-bearing candidate, and the retriever's first
candidate's on the same calls; and the departures from the
retriever's first by kind (took the room; another answer-bearing candidate where the first bore one too; left
an answer-bearing first for one without; among candidates none of which bore one). Reads files only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson


def call_figures(calls: list[dict]) -> dict:
    """Counts over ranker calls, each with `permutation` (chosen candidate positions, best first; empty when the
    output was invalid) and `candidate_has_answer` (one flag per candidate, in the retriever's order)."""
    moved = room = room_found = scored = hits = retriever_hits = 0
    departures = {"took_room": 0, "answer_for_answer": 0, "left_answer": 0, "no_answer": 0}
    for call in calls:
        flags, order = call["candidate_has_answer"], call["permutation"]
        first = order[0] if order else 0  # an invalid output falls back to the retriever's order
        moved += first != 0
        if first != 0:
            kind = (("answer_for_answer" if flags[first] else "left_answer") if flags[0]
                    else ("took_room" if flags[first] else "no_answer"))
            departures[kind] += 1
        if any(flags):
            scored += 1
            hits += bool(flags[first])
            retriever_hits += bool(flags[0])
            if not flags[0]:
                room += 1
                room_found += bool(flags[first])
    return {"calls": len(calls), "first_not_retrievers": moved, "calls_with_room": room,
            "room_taken": room_found, "scored_calls": scored, "hit1": hits / scored if scored else None,
            "retriever_hit1": retriever_hits / scored if scored else None,
            "departures": departures}


def run_figures(run: Path) -> list[dict]:
    rows = []
    for folder in sorted(run.glob("iter-*")):
        path = folder / "rollouts.jsonl"
        if not path.is_file():
            continue
        calls = [c for line in path.open("rb") for c in orjson.loads(line)["ranker_calls"]]
        rows.append({"iteration": int(folder.name.split("-")[1]), **call_figures(calls)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a `cosearch train` run folder")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    rows = run_figures(args.run)
    if not rows:
        sys.exit(f"{args.run}: no iter-*/rollouts.jsonl here; pass a `cosearch train` run folder")
    print("| iteration | ranker calls | first choice not the retriever's | calls with room | room taken | Hit@1 | "
          "retriever's Hit@1 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        hit1, ret = ("" if r[key] is None else f"{r[key]:.3f}" for key in ("hit1", "retriever_hit1"))
        print(f"| {r['iteration']} | {r['calls']} | {r['first_not_retrievers']} | {r['calls_with_room']} | "
              f"{r['room_taken']} | {hit1} | {ret} |")
    if args.json:
        figures = {"command": "python bench/ranker_choices.py " + " ".join(sys.argv[1:]), "iterations": rows}
        args.json.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
