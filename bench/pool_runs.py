"""Pool several models' greedy rollouts of the same questions into one rollout file, one trajectory per model
(issue 14, study 14: two seeds' ends scored as one).

    .venv/bin/python bench/pool_runs.py runs/fresh/s12-end.jsonl runs/fresh/s14-end.jsonl \
        -o runs/fresh/seeds-6it.jsonl

`cosearch evaluate score` scores a question as the mean over its trajectories, so comparing a start with the
pooled file gives the change of the models' mean F1 per question, with a paired bootstrap over questions: the
seeds' average gain, its interval reflecting the questions' variation, not the seeds' (two seeds cannot give
that). Every input must hold one trajectory per question and the same questions, or the script stops naming
the file and question; a malformed line or record stops it naming the file, line and fix, as the CLI's
readers do. Writes the pooled JSONL (question order of the first input; trajectory i comes from
input i, renumbered `sample` i) and its manifest (inputs' sha256).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pool(runs: list[list[dict]], names: list[str]) -> list[dict]:
    """The first run's records, each with every run's single trajectory of that question, in input order."""
    by_id = []
    for records, name in zip(runs, names):
        index = {}
        for record in records:
            if len(record["trajectories"]) != 1:
                raise SystemExit(f"{name}: question {record['question_id']!r} has {len(record['trajectories'])} "
                                 "trajectories; pool greedy rollouts (one a question)")
            index[record["question_id"]] = record
        by_id.append(index)
    first = set(by_id[0])
    for index, name in zip(by_id[1:], names[1:]):
        if set(index) != first:
            odd = sorted(first ^ set(index))[0]
            raise SystemExit(f"{name}: question {odd!r} is in one input but not in {names[0]}; pool rollouts of "
                             "the same questions")
    pooled = []
    for record in runs[0]:
        out = dict(record)
        out["trajectories"] = [dict(index[record["question_id"]]["trajectories"][0], sample=i)
                               for i, index in enumerate(by_id)]
        pooled.append(out)
    return pooled


def read_run(path: str) -> list[dict]:
    """The records of one rollout file as dicts, each checked as `cosearch evaluate` would read it."""
    from cosearch_cli.artifacts import Reader
    from cosearch_cli.records import read_rollout

    records = []
    for row in Reader.open(path).rows():
        read_rollout(row.data, row.path, row.line)
        records.append(row.data)
    return records


def main(argv: list[str] | None = None) -> None:
    from cosearch_cli.artifacts import file_sha256, make_manifest, manifest_path, write_bytes_atomic, \
        write_json_atomic
    from cosearch_cli.errors import CosearchError

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="greedy rollout JSONL files of the same questions")
    parser.add_argument("-o", "--output", required=True, help="the pooled rollout JSONL to write")
    args = parser.parse_args(argv)
    if len(args.runs) < 2:
        parser.error("pool two or more rollout files")
    try:
        runs = [read_run(p) for p in args.runs]
    except CosearchError as exc:
        raise SystemExit(f"error: {exc}") from None
    pooled = pool(runs, args.runs)
    write_bytes_atomic(args.output, b"".join(orjson.dumps(r) + b"\n" for r in pooled))
    write_json_atomic(manifest_path(args.output), make_manifest(
        "pool_runs", {"runs": args.runs}, inputs={p: file_sha256(p) for p in args.runs}))
    print(f"{len(pooled)} questions, {len(args.runs)} trajectories each -> {args.output}")


if __name__ == "__main__":
    main()
