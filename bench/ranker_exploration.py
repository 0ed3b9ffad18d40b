"""Would more exploration, or a longer view of each candidate, give the ranker's GRPO something to sharpen?
(issue 14, target b, after study 9)

    .venv/bin/python bench/ranker_exploration.py --run runs/s9-cosearch --ranker runs/study3/warmup \
        --index indexes/dev-bm25 --calls 48 --samples 6 --json out.json

Study 9 found the sampled ranker rarely leaves the retriever's first candidate (8% of calls) and, when it does,
chooses an answer-bearing candidate no more often than its preference for positions explains. GRPO can only
sharpen what is sampled, so this samples the starting ranker on training calls of that run (unique sub-query
and candidates, with an answer-bearing candidate; training calls, never held-out ones) in three arms: the
study's temperature 0.7 and 32 tokens a candidate, METHOD.md's temperature 1.0, and 1.0 reading 96 tokens. Per
arm: the share of samples that leave the retriever's first, the share of calls with room (an answer-bearing
candidate below a first without) where a sample takes it, and, over departures, how often the chosen candidate
bears an answer against a ranker blind to the passages with the same preference for positions, with a bootstrap
95% CI over questions, a question's calls and samples together (bench/ranker_choices.py's test).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ranker_choices import (call_figures, departure_draws, departures_vs_chance, first_choice,  # noqa: E402
                            position_rates)

ARMS = (("T=0.7, 32 tokens", 0.7, 32), ("T=1.0, 32 tokens", 1.0, 32), ("T=1.0, 96 tokens", 1.0, 96))


def unique_scored(pairs, limit: int):
    """The first `limit` calls with an answer-bearing candidate, one per (sub-query, candidates)."""
    seen, out = set(), []
    for record, call in pairs:
        key = (call.query, tuple(call.candidate_ids))
        if any(call.candidate_has_answer) and key not in seen:
            seen.add(key)
            out.append((record, call))
    return out[:limit]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, type=Path, help="a `cosearch train` run (its iter-*/rollouts.jsonl)")
    parser.add_argument("--ranker", required=True, help="the ranker to sample (the run's start)")
    parser.add_argument("--index", required=True)
    parser.add_argument("--calls", type=int, default=48)
    parser.add_argument("--samples", type=int, default=6)
    parser.add_argument("--json", required=True, type=Path)
    args = parser.parse_args()

    from cosearch_cli.generation import load_backend
    from cosearch_cli.index.build import open_index
    from cosearch_cli.ranker_quality import FixedCalls, fixed_calls, rerank
    from cosearch_cli.train import read_records

    pairs = []
    for path in sorted(args.run.glob("iter-*/rollouts.jsonl")):
        by_seed: dict = {}  # dynamic sampling's draws of one iteration differ in their seed only
        for record in read_records(path):
            by_seed.setdefault(record.sampling.get("seed"), []).append(record)
        for group in by_seed.values():
            calls = fixed_calls(group)
            pairs += calls.pairs
            base = calls.config  # the rollout's ranker settings; sampling, view and seed are set per arm below
    chosen = unique_scored(pairs, args.calls)
    docs = open_index(args.index).docs
    backend = load_backend(args.ranker, "hf", device="cpu")
    figures = {"command": "python bench/ranker_exploration.py " + " ".join(sys.argv[1:]), "calls": len(chosen),
               "questions": len({record.question_id for record, _ in chosen}),
               "samples_per_call": args.samples, "arms": []}
    for name, temperature, tokens in ARMS:
        outputs = []  # per call, one record per sample
        for sample in range(args.samples):
            config = replace(base, greedy=False, temperature=temperature, ranker_passage_tokens=tokens,
                             seed=1000 + sample)
            # rerank runs the rollout's prompt, constraint and parsing; sampled, since config.greedy is False
            scores = rerank(FixedCalls(chosen, 0, config), backend, docs, constrained=True)
            outputs += [{"id": f"{record.question_id}/s{i}/x{sample}", "call": i,
                         "candidate_has_answer": call.candidate_has_answer, "permutation": score.permutation}
                        for i, ((record, call), score) in enumerate(zip(chosen, scores))]
            print(f"{name}: sample {sample + 1}/{args.samples} done", file=sys.stderr)
        counts = call_figures(outputs)  # every chosen call has an answer-bearing candidate
        taken = {o["call"] for o in outputs if not o["candidate_has_answer"][0]
                 and o["candidate_has_answer"][first_choice(o)]}
        arm = {"arm": name, "temperature": temperature, "ranker_passage_tokens": tokens,
               "samples": len(outputs),
               "departure_share": counts["first_not_retrievers"] / len(outputs),
               "calls_with_room": counts["calls_with_room"] // args.samples, "room_taken_by_some_sample": len(taken),
               "room_taken_share_of_samples": counts["room_taken"] / max(1, counts["calls_with_room"]),
               # draws keyed by question: an output's id is <question>/s<call>/x<sample>
               "departures_vs_blind": departures_vs_chance(departure_draws(outputs), position_rates(outputs))}
        figures["arms"].append(arm)
        print(orjson.dumps(arm).decode(), file=sys.stderr)
    args.json.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
