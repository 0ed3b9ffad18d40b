"""How many questions question files share, by id (issue 14, study 11: its training pool against study 8's and
against its held-out set).

    .venv/bin/python bench/question_overlap.py runs/study11/train.jsonl runs/study8/train.jsonl \
        runs/study11-split/heldout.jsonl --json runs/s11-cosearch/overlap.json

Prints and writes each file's question count and, for every pair of files, how many ids both hold.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import orjson


def question_ids(path: Path) -> set[str]:
    return {orjson.loads(line)["id"] for line in path.read_bytes().splitlines() if line.strip()}


def overlap(files: dict[str, set[str]]) -> dict:
    """Each file's count, and the ids each pair shares (`a & b`)."""
    return {"questions": {name: len(ids) for name, ids in files.items()},
            "shared": {f"{a} & {b}": len(files[a] & files[b]) for a, b in itertools.combinations(files, 2)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="question JSONL files")
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args()
    figures = overlap({str(path): question_ids(path) for path in args.files})
    print(orjson.dumps(figures, option=orjson.OPT_INDENT_2).decode())
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
