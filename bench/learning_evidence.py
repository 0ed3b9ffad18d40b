"""Sum up the learning-evidence runs (issues 7, 14): one table per preset, the runs' curves side by side, and
with --json the held-out figures of each run with paired bootstrap 95% CIs (cosearch_cli/gains.py): agent F1
before/after on the run's dev questions, and the ranker's Hit@1 on one shared set of fixed held-out ranker calls
(those of the first run with an LLM ranker, from its evaluation before training) for the ranker the run started
from and the one it ended with (search-r1 shows the retriever's order), against the retriever's order.

    .venv/bin/python bench/learning_evidence.py --runs runs/learn-search-r1 runs/learn-fixed-ranker \
        runs/learn-cosearch --png bench/results/learning_curves.png --json bench/results/learning_evidence.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import polars as pl

from cosearch_cli.curves import compare_curves

COLUMNS = ("iteration", "train_reward", "train_f1", "format_ok", "search_turns", "ranker_valid", "ranker_hit_at_k",
           "agent_groups_kept", "ranker_groups_kept", "dev_f1", "dev_em", "dev_search_turns", "dev_hit_at_k")


def load(run: Path) -> list[dict]:
    rows = pl.read_parquet(run / "metrics.parquet").to_dicts()
    for row in rows:
        if isinstance(row.get("seconds"), str):
            row["seconds"] = orjson.loads(row["seconds"])
    return rows


def table(rows: list[dict]) -> str:
    present = [c for c in COLUMNS if any(r.get(c) is not None for r in rows)]
    out = ["| " + " | ".join(present) + " | step seconds |", "|" + "---|" * (len(present) + 1)]
    for r in sorted(rows, key=lambda r: r["iteration"]):
        cells = ["" if r.get(c) is None else (f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]))
                 for c in present]
        seconds = r.get("seconds") or {}
        cells.append(f"{sum(seconds.values()):.0f}" if isinstance(seconds, dict) and seconds else "")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def run_figures(run: Path, calls) -> dict:
    """One run's before/after figures; the ranker is judged on the shared `calls`."""
    from cosearch_cli.gains import compare_runs
    from cosearch_cli.ranker_quality import rerank
    from cosearch_cli.train import Runner, current_models, load_config, read_records

    config = load_config(run / "config.toml")
    runner = Runner(config)
    last = run / f"iter-{config.iterations - 1:04d}" / "eval" / "rollouts.jsonl"
    before, after = read_records(run / "eval-init" / "rollouts.jsonl"), read_records(last)
    ranker_before = ranker_after = None  # None: the retriever's own order
    if config.ranker == "llm":
        start, end = current_models(runner.paths, config, 0).ranker, current_models(runner.paths, config,
                                                                                      config.iterations).ranker
        constrained = "ranker" in runner.constraint_roles()
        ranker_before = rerank(calls, runner.backend(start), runner.index.docs, constrained=constrained)
        ranker_after = ranker_before if end == start else rerank(calls, runner.backend(end), runner.index.docs,
                                                                 constrained=constrained)
    figures = compare_runs(before, after, calls=calls, ranker_before=ranker_before, ranker_after=ranker_after)
    seconds = [sum(r["seconds"].values()) for r in load(run) if isinstance(r.get("seconds"), dict)]
    return {"preset": run.name, **{k: v for k, v in figures.items() if k != "bootstrap"},
            "hours": round(sum(seconds) / 3600, 2), "bootstrap": figures["bootstrap"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run folders (each with metrics.parquet)")
    ap.add_argument("--png", required=True, help="where to draw the curves of all runs")
    ap.add_argument("--json", help="write the held-out figures of every run here (issue 14's fields)")
    ap.add_argument("--title", default="search-r1 vs fixed-ranker vs cosearch (SmolLM2-135M, equal budget)")
    args = ap.parse_args()
    runs = {Path(r).name: load(Path(r)) for r in args.runs}
    compare_curves(runs, args.png, title=args.title)
    for name, rows in runs.items():
        total = sum(sum((r.get("seconds") or {}).values()) for r in rows if isinstance(r.get("seconds"), dict))
        print(f"### {name} ({total / 60:.1f} min of steps)\n\n{table(rows)}\n")
    if args.json:
        from cosearch_cli.ranker_quality import fixed_calls
        from cosearch_cli.train import load_config, read_records

        llm = [Path(r) for r in args.runs if load_config(Path(r) / "config.toml").ranker == "llm"]
        calls = fixed_calls(read_records(llm[0] / "eval-init" / "rollouts.jsonl")) if llm else None
        out = {"calls_from": str(llm[0]) if llm else None,
               "presets": [run_figures(Path(r), calls) for r in args.runs]}
        Path(args.json).write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
