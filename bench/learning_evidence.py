"""Sum up the learning-evidence runs (issue 7): one table per preset and the three runs' curves side by side.

    .venv/bin/python bench/learning_evidence.py --runs runs/learn-search-r1 runs/learn-fixed-ranker \
        runs/learn-cosearch --png bench/results/learning_curves.png > /tmp/tables.md
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", required=True, help="run folders (each with metrics.parquet)")
    ap.add_argument("--png", required=True, help="where to draw the curves of all runs")
    ap.add_argument("--title", default="search-r1 vs fixed-ranker vs cosearch (SmolLM2-135M, equal budget)")
    args = ap.parse_args()
    runs = {Path(r).name: load(Path(r)) for r in args.runs}
    compare_curves(runs, args.png, title=args.title)
    for name, rows in runs.items():
        total = sum(sum((r.get("seconds") or {}).values()) for r in rows if isinstance(r.get("seconds"), dict))
        print(f"### {name} ({total / 60:.1f} min of steps)\n\n{table(rows)}\n")


if __name__ == "__main__":
    main()
