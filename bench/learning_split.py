"""Question files for the learning-evidence runs (issue 7): training and evaluation never overlap.

Evaluation: the first `--eval-per-dataset` questions of each ../shared/data/dev file in sha1-of-id order (the
same questions `bench/valid_actions.py` evaluates on). Training: the next `--train-dev-per-dataset` dev
questions of each file in that order, plus the first `--train-extra-per-file` questions of each
../shared/data/extra_qa_only file in the same order (their passages are not in the corpus, so they teach
searching and answering under retrieval misses, as in the paper's training mix).

    .venv/bin/python bench/learning_split.py --out runs/learning

`--subset FILE` (one training-question id per line) also writes `subset.jsonl`: those training questions only,
for the fixed-set check that GRPO raises the reward on the questions it trains on (learning_overfit.toml).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import orjson

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def ordered(path: Path) -> list[dict]:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return sorted(rows, key=lambda q: hashlib.sha1(q["id"].encode()).hexdigest())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval-per-dataset", type=int, default=15)
    ap.add_argument("--train-dev-per-dataset", type=int, default=30)
    ap.add_argument("--train-extra-per-file", type=int, default=30)
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--subset", help="file of training-question ids (one per line) to write as subset.jsonl")
    args = ap.parse_args()
    evaluation, train = [], []
    for path in sorted((DATA / "dev").glob("*.jsonl")):
        rows = ordered(path)
        evaluation += rows[:args.eval_per_dataset]
        train += rows[args.eval_per_dataset:args.eval_per_dataset + args.train_dev_per_dataset]
    for path in sorted((DATA / "extra_qa_only").glob("*.jsonl")):
        train += ordered(path)[:args.train_extra_per_file]
    eval_ids, eval_questions = {q["id"] for q in evaluation}, {q["question"].strip().lower() for q in evaluation}
    leaked = [q["id"] for q in train if q["id"] in eval_ids or q["question"].strip().lower() in eval_questions]
    assert not leaked, f"training questions overlap the evaluation set: {leaked[:5]}"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = [("eval.jsonl", evaluation), ("train.jsonl", train)]
    if args.subset:
        wanted = [line.split("#")[0].strip() for line in Path(args.subset).read_text().splitlines()]
        by_id = {q["id"]: q for q in train}
        missing = [i for i in wanted if i and i not in by_id]
        assert not missing, f"not training questions: {missing}"
        files.append(("subset.jsonl", [by_id[i] for i in wanted if i]))
    for name, rows in files:
        (out / name).write_bytes(b"".join(orjson.dumps(q) + b"\n" for q in rows))
        print(f"{out / name}: {len(rows)} questions")


if __name__ == "__main__":
    main()
