"""Rollout shards sharing one machine: N concurrent `cosearch rollout --shard i/N` processes against one process
with all cores, on the same questions (the shards' union is the single run's questions, and every row samples
with its own seed, so both produce the same tokens).

Three configurations, one after the other, each a fresh process per shard (model load included, as a job
array pays it):
  one        one process, --threads = the CPUs this machine gives us (what a single job would use)
  shards     N processes at once, each --threads = CPUs / N (what cosearch now picks under Slurm, taskset or
             OMP_NUM_THREADS, and what the Slurm examples pass)
  oversub    N processes at once, each --threads = all CPUs (torch's own default before: every process
             starts one thread per core of the machine)

Throughput = generated tokens (agent + ranker, counted in the output records) / wall seconds of the whole
configuration. The machine's load (uptime) is recorded before and after each configuration.

    .venv/bin/python bench/bench_threads.py --shards 2 --questions 4 --out bench/results/threads.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
from results_io import uptime, write_results

ROOT = Path(__file__).resolve().parent.parent


def generated_tokens(path: Path) -> int:
    total = 0
    for line in path.read_bytes().splitlines():
        row = orjson.loads(line)
        if row.get("kind") != "rollout":
            continue
        total += sum(sum(t["loss_mask"]) for t in row["trajectories"])
        total += sum(len(c.get("output_ids") or []) for c in row["ranker_calls"])
    return total


def run_config(name: str, shards: int, threads: int, questions: int, n: int, index: str, work: Path,
               timeout: float | None = None, same_work_tokens: int | None = None) -> dict:
    """Run one configuration; past `timeout` seconds its processes are stopped and its rate is reported as
    below `same_work_tokens` / timeout (every configuration generates the same tokens)."""
    before = uptime()
    per_shard = -(-questions // shards)
    procs, outputs = [], []
    started = time.perf_counter()
    for i in range(shards):
        out = work / f"{name}-{i}.jsonl"
        outputs.append(out)
        command = [sys.executable, "-m", "cosearch_cli", "rollout", "--questions", str(ROOT / "fixtures/train.jsonl"),
                   "--index", index, "--n", str(n), "--threads", str(threads), "--limit", str(per_shard),
                   "--quiet", "-o", str(out)]
        if shards > 1:
            command += ["--shard", f"{i}/{shards}"]
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "SLURM_CPUS_PER_TASK")}
        procs.append(subprocess.Popen(command, env=env, cwd=ROOT))
    row = {"config": name, "processes": shards, "threads_each": threads, "questions": per_shard * shards}
    try:
        codes = [p.wait(timeout=None if timeout is None else max(1.0, started + timeout - time.perf_counter()))
                 for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
            p.wait()
        return row | {"tokens": None, "wall_s": f"> {timeout:.0f} (stopped)",
                      "tokens_per_s": round(same_work_tokens / timeout, 2), "below": True,
                      "uptime_before": before, "uptime_after": uptime()}
    wall = time.perf_counter() - started
    if any(codes):
        raise SystemExit(f"{name}: a rollout process failed ({codes})")
    tokens = sum(generated_tokens(out) for out in outputs)
    return row | {"tokens": tokens, "wall_s": round(wall, 1), "tokens_per_s": round(tokens / wall, 2),
                  "below": False, "uptime_before": before, "uptime_after": uptime()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--questions", type=int, default=4, help="questions in all (split over the shards)")
    parser.add_argument("--n", type=int, default=4, help="trajectories per question")
    parser.add_argument("--index", default=str(ROOT / "indexes/fixture"))
    parser.add_argument("--oversub-timeout", type=float, default=150.0,
                        help="stop the oversubscribed configuration after this many seconds (it can crawl)")
    parser.add_argument("--out", default=None, help="Markdown results (a .json twin is written beside it)")
    args = parser.parse_args()
    if args.questions % args.shards:
        parser.error("--questions must be a multiple of --shards (the shards split exactly the single run's work)")
    cpus = len(os.sched_getaffinity(0))
    if not Path(args.index).is_dir():
        subprocess.run([sys.executable, "-m", "cosearch_cli", "index", "fixture", "--out", args.index, "--quiet"],
                       check=True, cwd=ROOT)
    work = ROOT / "bench" / ".threads-work"
    work.mkdir(exist_ok=True)
    rows = [run_config("one", 1, cpus, args.questions, args.n, args.index, work),
            run_config("shards", args.shards, max(1, cpus // args.shards), args.questions, args.n, args.index, work)]
    rows.append(run_config("oversub", args.shards, cpus, args.questions, args.n, args.index, work,
                           timeout=args.oversub_timeout, same_work_tokens=rows[0]["tokens"]))
    one = rows[0]["tokens_per_s"]
    for row in rows:
        row["vs_one"] = round(row["tokens_per_s"] / one, 3)
    result = {"cpus": cpus, "shards": args.shards, "questions": args.questions, "n": args.n, "rows": rows,
              "command": " ".join([Path(sys.executable).name, *sys.argv])}
    lines = [f"# {args.shards} concurrent rollout shards vs one process ({cpus} CPUs)", "",
             f"`{result['command']}`; SmolLM2 agent + llm ranker, `--sizes cpu`, {args.questions} fixture training "
             f"questions x G={args.n} in all, each configuration's processes started together (model load "
             "included). Goal: shards >= 0.8x one process.", "",
             "| configuration | processes x threads | generated tokens | wall s | tokens/s | vs one | load before -> after |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        lb = row["uptime_before"].split("load average:")[-1].strip()
        la = row["uptime_after"].split("load average:")[-1].strip()
        tokens = f"{row['tokens']:,}" if row["tokens"] is not None else "(stopped)"
        below = "< " if row["below"] else ""
        lines.append(f"| {row['config']} | {row['processes']} x {row['threads_each']} | {tokens} | "
                     f"{row['wall_s']} | {below}{row['tokens_per_s']} | {below}{row['vs_one']:.2f}x | {lb} -> {la} |")
    write_results(args.out, "\n".join(lines) + "\n", result)


if __name__ == "__main__":
    main()
