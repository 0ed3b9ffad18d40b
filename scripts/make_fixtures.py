"""Cut the bundled fixture slice out of ../shared/data (run once by a maintainer; the result is committed).

Per dataset: 24 questions chosen by sha1 of their id (answerable from the corpus where the data says so),
two thirds for training and one third for evaluation (16 and 8; Bamboogle, with 13 supported questions,
8 and 5), so every dataset is in both splits; the corpus is every passage those questions point at (benchmark context
paragraphs, retrieved passages, a few answer-bearing passages) plus 300 random wiki-18 distractors.
Usage: python scripts/make_fixtures.py [../shared/data] [fixtures]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import orjson

DATASETS = ("nq", "triviaqa", "popqa", "bamboogle", "hotpotqa", "2wikimultihopqa", "musique")
PER_DATASET, TRAIN_PER_DATASET, DISTRACTORS = 24, 16, 300
ID_LISTS = ("gold_passage_ids", "context_passage_ids", "retrieved_passage_ids", "answer_passage_ids")


def read_jsonl(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def sha(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def supported(q: dict) -> bool:
    return bool(q.get("answer_in_gold") or q.get("answer_in_retrieved"))


def main(data: Path, out: Path) -> None:
    corpus = {}
    for path in sorted((data / "corpus").glob("*.jsonl")):
        for p in read_jsonl(path):
            corpus[p["id"]] = p
    train, dev, wanted = [], [], set()
    for name in DATASETS:
        questions = sorted(read_jsonl(data / "dev" / f"{name}.jsonl"), key=lambda q: sha(q["id"]))
        chosen = [q for q in questions if supported(q)][:PER_DATASET]
        n_train = len(chosen) * TRAIN_PER_DATASET // PER_DATASET  # a short dataset keeps the same shares
        for i, q in enumerate(chosen):
            ids = q.get("context_passage_ids") or q.get("gold_passage_ids") or []
            ids = ids + q.get("retrieved_passage_ids", []) + q.get("answer_passage_ids", [])[:3]
            wanted.update(ids)
            (train if i < n_train else dev).append(q)
    assert {q["dataset"] for q in dev} == set(DATASETS), "every dataset must be in the dev split"
    distractors = sorted((pid for pid in corpus if pid.startswith("wiki18-sample") and pid not in wanted),
                         key=sha)[:DISTRACTORS]
    wanted.update(distractors)
    passages = [corpus[pid] for pid in sorted(wanted) if pid in corpus]
    kept = {p["id"] for p in passages}
    for q in train + dev:  # keep id lists consistent with the slice
        for key in ID_LISTS:
            if key in q:
                q[key] = [pid for pid in q[key] if pid in kept]
    out.mkdir(parents=True, exist_ok=True)
    write(out / "corpus.jsonl", passages)
    write(out / "train.jsonl", train)
    write(out / "dev.jsonl", dev)
    print(f"{len(passages)} passages, {len(train)} train and {len(dev)} dev questions", file=sys.stderr)


def write(path: Path, rows: list[dict]) -> None:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]) if args else Path("../shared/data"), Path(args[1]) if len(args) > 1 else Path("fixtures"))
