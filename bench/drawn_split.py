"""Split a training run's question pool into the questions it drew and those it never drew (issue 14, study 11).

    .venv/bin/python bench/drawn_split.py --run runs/s11-cosearch --questions runs/study11/train.jsonl \
        --out runs/s11-sampled

A run draws its training questions from a pool, iteration by iteration (`iter-*/rollouts.jsonl`). Writes
OUT/drawn.jsonl (the pool's questions some iteration rolled out: what RL trained on or rejected for having no
reward spread) and OUT/unseen.jsonl (the rest: never rolled out in training, warm-up or tuning, yet selected
by the same rule as the training questions), each line copied from the pool unchanged and in the pool's order,
and prints the counts. A drawn id missing from the pool is an error: the pool is not the one the run used.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def drawn_ids(run: Path) -> set[str]:
    """Question ids rolled out by the run's training iterations."""
    from cosearch_cli.train import read_records

    files = sorted(run.glob("iter-*/rollouts.jsonl"))
    if not files:
        raise SystemExit(f"{run}: no iter-*/rollouts.jsonl; pass the folder of a `cosearch train` run")
    return {record.question_id for path in files for record in read_records(path)}


def split_pool(lines: list[bytes], ids: set[str], source: str) -> tuple[list[bytes], list[bytes]]:
    """The pool's lines whose id is in `ids`, and the others; every id in `ids` must be in the pool."""
    drawn, unseen, seen = [], [], set()
    for line in lines:
        if not line.strip():
            continue
        qid = orjson.loads(line)["id"]
        seen.add(qid)
        (drawn if qid in ids else unseen).append(line)
    missing = ids - seen
    if missing:
        raise SystemExit(f"{source}: {len(missing)} questions the run drew are not in it (e.g. {min(missing)}); "
                         "pass the pool the run was trained from")
    return drawn, unseen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, type=Path, help="a `cosearch train` run folder")
    parser.add_argument("--questions", required=True, type=Path, help="the question JSONL the run drew from")
    parser.add_argument("--out", required=True, type=Path, help="folder for drawn.jsonl and unseen.jsonl")
    args = parser.parse_args()
    from question_overlap import question_ids

    question_ids(args.questions)  # the checked reader: a malformed pool fails here, naming file and line
    drawn, unseen = split_pool(args.questions.read_bytes().splitlines(), drawn_ids(args.run), str(args.questions))
    args.out.mkdir(parents=True, exist_ok=True)
    for name, lines in (("drawn", drawn), ("unseen", unseen)):
        tmp = args.out / f".{name}.jsonl.tmp"
        tmp.write_bytes(b"".join(line + b"\n" for line in lines))
        tmp.replace(args.out / f"{name}.jsonl")
    print(f"{args.questions}: {len(drawn)} drawn by {args.run}, {len(unseen)} never drawn -> {args.out}")


if __name__ == "__main__":
    main()
