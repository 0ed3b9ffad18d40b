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
    """The ids of a question JSONL file, read (and checked) as every stage reads questions."""
    from cosearch_cli.train import read_questions

    return {q.id for q in read_questions(path)}


def overlap(files: dict[str, set[str]]) -> dict:
    """Each file's count, and the ids each pair shares (`a & b`)."""
    return {"questions": {name: len(ids) for name, ids in files.items()},
            "shared": {f"{a} & {b}": len(files[a] & files[b]) for a, b in itertools.combinations(files, 2)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path, help="question JSONL files")
    parser.add_argument("--json", help="write the counts here")
    args = parser.parse_args()
    text = orjson.dumps(overlap({str(path): question_ids(path) for path in args.files}), option=orjson.OPT_INDENT_2)
    print(text.decode())
    if args.json:
        Path(args.json).write_bytes(text)


if __name__ == "__main__":
    main()
