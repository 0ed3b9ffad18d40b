"""What the ranker chose in a run's training rollouts, iteration by iteration (issue 14, study 9).

    .venv/bin/python bench/ranker_choices.py runs/s9-cosearch [--json out.json]

Held-out Hit@1 moves only when the greedy ranker's first choice changes; this shows whether the sampled ranker
was moving towards such a change. Per iteration, over the ranker calls of its training rollouts
(`iter-*/rollouts.jsonl`): calls; calls whose first choice is not the retriever's first candidate; calls with
room (some candidate bears a gold answer, the retriever's first does not); of those, calls whose first choice
bears one; the ranker's Hit@1 over calls with any answer-bearing candidate, and the retriever's first
candidate's on the same calls; and the departures from the
retriever's first by kind (took the room; another answer-bearing candidate where the first bore one too; left
an answer-bearing first for one without; among candidates none of which bore one). Over the whole run: how
often the departures on calls with an answer-bearing candidate chose one, against a ranker blind to the
passages with the same preference for positions (a departure to position j bears an answer as often as
position j does over all the run's calls), with a bootstrap 95% CI over questions. Reads files only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson


def first_choice(call: dict) -> int:
    """The position the ranker put first; an invalid output (no permutation) falls back to the retriever's."""
    return call["permutation"][0] if call["permutation"] else 0


def call_figures(calls: list[dict]) -> dict:
    """Counts over ranker calls, each with `permutation` (chosen candidate positions, best first; empty when the
    output was invalid) and `candidate_has_answer` (one flag per candidate, in the retriever's order)."""
    moved = room = room_found = scored = hits = retriever_hits = 0
    departures = {"took_room": 0, "answer_for_answer": 0, "left_answer": 0, "no_answer": 0}
    for call in calls:
        flags, first = call["candidate_has_answer"], first_choice(call)
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


def position_rates(calls: list[dict]) -> dict[int, float]:
    """Over the calls with an answer-bearing candidate: the share whose candidate at each position bears one."""
    scored = [call["candidate_has_answer"] for call in calls if any(call["candidate_has_answer"])]
    width = max((len(flags) for flags in scored), default=0)
    return {j: sum(len(f) > j and f[j] for f in scored) / len(scored) for j in range(width)}


def departure_draws(calls: list[dict]) -> dict[str, list[tuple[int, int]]]:
    """Per question, one (chose an answer-bearing candidate, position chosen) pair for each departure from the
    retriever's first candidate on a call with an answer-bearing candidate. A question is the part of a call id
    before its "/s<sample>" (`<question>/s<sample>/t<turn>`)."""
    draws: dict[str, list[tuple[int, int]]] = {}
    for call in calls:
        flags, first = call["candidate_has_answer"], first_choice(call)
        if first != 0 and any(flags):
            draws.setdefault(call["id"].rsplit("/s", 1)[0], []).append((int(flags[first]), first))
    return draws


def departures_vs_chance(draws: dict[str, list[tuple[int, int]]], rates: dict[int, float], samples: int = 1000,
                         seed: int = 0) -> dict:
    """How often departures chose an answer-bearing candidate, against a ranker blind to the passages with the
    same preference for positions: a departure to position j bears an answer as often as position j does over
    all calls (`rates`, from `position_rates`). Bootstrap 95% CI of the difference resampling questions (a
    question's departures together: its samples are not independent)."""
    import random

    def rate_and_chance(keys):
        pairs = [pair for key in keys for pair in draws[key]]
        return sum(p[0] for p in pairs) / len(pairs), sum(rates[p[1]] for p in pairs) / len(pairs)

    keys = sorted(draws)
    if not keys:
        return {"departures": 0, "to_answer": 0, "questions": 0, "rate": None, "chance_rate": None,
                "diff_ci": None, "by_position": {}}
    rate, chance = rate_and_chance(keys)
    rng = random.Random(seed)
    diffs = sorted(a - b for a, b in (rate_and_chance([rng.choice(keys) for _ in keys]) for _ in range(samples)))
    pairs = [pair for key in keys for pair in draws[key]]
    by_position = {}
    for hit, position in pairs:
        row = by_position.setdefault(str(position + 1), {"departures": 0, "to_answer": 0,
                                                         "position_rate": rates[position]})
        row["departures"] += 1
        row["to_answer"] += hit
    return {"departures": len(pairs), "to_answer": sum(p[0] for p in pairs), "questions": len(keys),
            "rate": rate, "chance_rate": chance,
            "diff_ci": [diffs[int(0.025 * samples)], diffs[int(0.975 * samples) - 1]],
            "by_position": dict(sorted(by_position.items()))}


def read_calls(run: Path) -> list[tuple[int, list[dict]]]:
    out = []
    for folder in sorted(run.glob("iter-*")):
        path = folder / "rollouts.jsonl"
        if path.is_file():
            out.append((int(folder.name.split("-")[1]),
                        [c for line in path.open("rb") for c in orjson.loads(line)["ranker_calls"]]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a `cosearch train` run folder")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    iterations = read_calls(args.run)
    rows = [{"iteration": iteration, **call_figures(calls)} for iteration, calls in iterations]
    if not rows:
        sys.exit(f"{args.run}: no iter-*/rollouts.jsonl here; pass a `cosearch train` run folder")
    print("| iteration | ranker calls | first choice not the retriever's | calls with room | room taken | Hit@1 | "
          "retriever's Hit@1 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        hit1, ret = ("" if r[key] is None else f"{r[key]:.3f}" for key in ("hit1", "retriever_hit1"))
        print(f"| {r['iteration']} | {r['calls']} | {r['first_not_retrievers']} | {r['calls_with_room']} | "
              f"{r['room_taken']} | {hit1} | {ret} |")
    draws: dict = {}
    every_call = []
    for iteration, calls in iterations:
        every_call += calls
        for key, pairs in departure_draws(calls).items():
            draws.setdefault(f"{iteration}:{key}", []).extend(pairs)
    test = departures_vs_chance(draws, position_rates(every_call))
    if test["departures"]:
        print(f"departures on calls with an answer-bearing candidate: {test['departures']} over "
              f"{test['questions']} questions, chose one {test['rate']:.3f} (blind, same positions: "
              f"{test['chance_rate']:.3f}), "
              f"difference 95% CI [{test['diff_ci'][0]:+.3f}, {test['diff_ci'][1]:+.3f}]")
    if args.json:
        figures = {"command": "python bench/ranker_choices.py " + " ".join(sys.argv[1:]), "iterations": rows,
                   "departures_vs_chance": test}
        args.json.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
