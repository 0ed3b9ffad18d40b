"""Speed of `cosearch group` and `cosearch reward` on synthetic rollout records (issue 4 target: 100,000
ranker calls from 2,000 questions in under 10 s per stage; cost linear in the number of questions).

The records have the shape `cosearch rollout` writes: G=8 trajectories per question, ~6 searches each, every
search a ranker call over N=50 candidates (ids, scores, answer flags) choosing K=5, with a short ranker output
(40 tokens, log-probs). Sub-queries are paraphrases (word drops, additions, swaps) of a few per-question hops,
so clustering meets both near-duplicates and distinct queries. Token lists are shortened (agent sequences 256
tokens, ranker prompts --prompt-tokens, default 0): a real rollout stores each ranker prompt (~2-7k tokens),
and that JSON costs every stage the same per megabyte; the MB/s column shows it.

    nice -n 10 .venv/bin/python bench/bench_group_reward.py --questions 500 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
COSEARCH = str(ROOT / ".venv" / "bin" / "cosearch")
WORDS = [f"w{i}" for i in range(3000)]
G, N, K = 8, 50, 5


def paraphrase(rng: random.Random, base: list[str]) -> str:
    words = list(base)
    edit = rng.random()
    if edit < 0.3 and len(words) > 3:
        words.pop(rng.randrange(len(words)))
    elif edit < 0.55:
        words.insert(rng.randrange(len(words) + 1), rng.choice(WORDS))
    elif edit < 0.7:
        i, j = rng.randrange(len(words)), rng.randrange(len(words))
        words[i], words[j] = words[j], words[i]
    elif edit < 0.8:
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 8))]  # an unrelated sub-query
    return " ".join(words).capitalize() + "?"


def make_record(rng: random.Random, q: int, calls_per_question: int, prompt_tokens: int) -> dict:
    qid = f"q{q:06d}"
    answer = " ".join(rng.sample(WORDS, 2))
    hops = [rng.sample(WORDS, rng.randint(4, 8)) for _ in range(rng.randint(2, 3))]
    turns_per_sample = [calls_per_question // G + (1 if s < calls_per_question % G else 0) for s in range(G)]
    trajectories, calls = [], []
    for s in range(G):
        format_ok = rng.random() > 0.05
        answer_text = answer if rng.random() < 0.4 else " ".join(rng.sample(WORDS, 2))
        turns = []
        for t in range(turns_per_sample[s]):
            query = paraphrase(rng, hops[min(t * len(hops) // max(turns_per_sample[s], 1), len(hops) - 1)])
            easy = rng.random() < 0.45
            has = [False] * N
            if easy:
                for i in rng.sample(range(N), rng.randint(1, 3)):
                    has[i] = True
            perm = rng.sample(range(N), K)
            valid = rng.random() > 0.1
            ids = [f"wiki-{rng.randrange(21_000_000)}" for _ in range(N)]
            calls.append({
                "id": f"{qid}/s{s}/t{t}", "sample": s, "turn": t, "query": query, "ranker": "llm",
                "candidate_ids": ids, "candidate_scores": sorted((rng.random() * 100 for _ in range(N)), reverse=True),
                "candidate_has_answer": has, "permutation": perm if valid else [],
                "chosen_ids": [ids[i] for i in (perm if valid else range(K))], "valid": valid,
                "error": None if valid else "duplicate id",
                "prompt_ids": [rng.randrange(49152) for _ in range(prompt_tokens)],
                "output_ids": [rng.randrange(49152) for _ in range(40)],
                "logprobs": [-rng.random() for _ in range(40)],
                "output_text": "<reason> passages 3 and 7 name the person </reason> "
                               "<ranking> [3] > [7] > [1] > [12] > [4] </ranking>"})
            turns.append({"text": f"<think> hop {t} </think> <search> {query} </search>", "token_ids": [1] * 12,
                          "logprobs": [-0.5] * 12, "action": "search", "query": query,
                          "ranker_call": f"{qid}/s{s}/t{t}", "observation_ids": calls[-1]["chosen_ids"]})
        turns.append({"text": f"<think> done </think> <answer> {answer_text} </answer>", "token_ids": [1] * 10,
                      "logprobs": [-0.5] * 10, "action": "answer" if format_ok else "invalid"})
        trajectories.append({
            "sample": s, "turns": turns, "answer": answer_text if format_ok else None,
            "n_searches": turns_per_sample[s], "format_ok": format_ok,
            "format_error": None if format_ok else "turn has no action tag",
            "token_ids": [rng.randrange(49152) for _ in range(256)], "loss_mask": [1] * 256,
            "logprobs": [-0.3] * 256, "prompt_len": 64})
    return {"question_id": qid, "question": f"Question {q} about {' '.join(hops[0])}?", "answers": [answer],
            "dataset": "hotpotqa", "trajectories": trajectories, "ranker_calls": calls, "stage": "rollout",
            "sampling": {"temperature": 1.0, "n": G, "k": K}, "groups": [], "kind": "rollout", "schema": 1}


def write_rollouts(path: Path, questions: int, calls_per_question: int, prompt_tokens: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "wb") as handle:
        for q in range(questions):
            handle.write(orjson.dumps(make_record(rng, q, calls_per_question, prompt_tokens)) + b"\n")


def timed(cmd: list[str]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MB) of one child process.

    On this shared machine the wall time swings with other people's jobs; CPU time much less."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", *cmd], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr}")
    rss_kb, user, system = proc.stderr.strip().splitlines()[-1].split()
    return wall, float(user) + float(system), int(rss_kb) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--calls-per-question", type=int, default=50)
    parser.add_argument("--prompt-tokens", type=int, default=0, help="ranker prompt tokens stored per call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="append the Markdown table to this file")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for questions in args.questions:
            rollouts, grouped, scored = (tmp / f"{name}{questions}.jsonl" for name in ("r", "g", "s"))
            write_rollouts(rollouts, questions, args.calls_per_question, args.prompt_tokens)
            stats = {}
            for stage, cmd in (("group", [COSEARCH, "group", str(rollouts), "-o", str(grouped), "--summary",
                                          str(tmp / "groups.parquet"), "-q"]),
                               ("reward", [COSEARCH, "reward", str(grouped), "-o", str(scored), "-q"])):
                runs = [timed(cmd) for _ in range(args.repeats)]
                stats[stage] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs),
                                max(r[2] for r in runs), os.path.getsize(cmd[2]) / 1e6)
            calls = questions * args.calls_per_question
            for stage, (wall, cpu, rss, mb) in stats.items():
                rows.append(f"| {stage} | {questions:,} | {calls:,} | {mb:,.0f} | {wall:.2f} | {cpu:.2f} | "
                            f"{calls / wall:,.0f} | {mb / wall:,.0f} | {rss:,.0f} |")
            print(rows[-2], rows[-1], sep="\n", flush=True)
    table = "\n".join([
        f"`{' '.join(['nice -n 10 .venv/bin/python bench/bench_group_reward.py', *sys.argv[1:]])}` "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()}, {os.cpu_count()} cores, "
        f"median of {args.repeats}, ranker prompt tokens per call: {args.prompt_tokens})", "",
        "| stage | questions | ranker calls | input MB | wall s | CPU s | calls/s (wall) | MB/s (wall) | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|", *rows, ""])
    print(table)
    if args.out:
        with open(args.out, "a") as handle:
            handle.write(table + "\n")


if __name__ == "__main__":
    main()
