"""RL training questions the agent can answer from what it is shown (issue 14, study 8).

    .venv/bin/python bench/answerable_pool.py --exclude runs/study3/heldout.jsonl \
        --exclude runs/study3/warmup.jsonl --index indexes/dev-bm25 --per-dataset 120 --out runs/study8/train.jsonl

Studies 2-7 trained on questions of which about a third (the extra_qa_only files) have no passage in the corpus
and most others show no gold answer in the passages the agent reads: a sampled group then scores 0 throughout
and carries no signal (about one question in four gave a reward spread). This draws training questions from
the dev files (sha1-of-id order per dataset, none of them a question of an `--exclude` file by id or
normalised text) and keeps a question when
- a gold answer lies within the first `--passage-tokens` tokens (SmolLM2's tokenizer, as the agent reads them)
  of one of the retriever's top `--k` passages for the question's own text (the warmed-up agent's first query is
  the question verbatim), by DPR-style has_answer (yes/no answers never count), and
- no gold answer is the title of one of the retriever's top `--top-n` (study 4's title rule,
  bench/title_filter.py: a copied title would earn the reward without reading).
It selects training data with the gold answers, as pass-rate filtering does; reward, grouping and updates stay
METHOD.md's. At most `--per-dataset` kept questions per dataset, in sha1 order. Writes the kept questions and a
manifest (inputs' hashes, options, per-dataset counts) beside them, and prints the counts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from learning_split import DATA, read_file, row  # noqa: E402

from cosearch_cli.answerable import answerable  # noqa: E402
from cosearch_cli.artifacts import Writer, file_sha256, make_manifest  # noqa: E402
from cosearch_cli.records import Question, read_questions  # noqa: E402
from cosearch_cli.splits import QuestionKeys, sha1_order  # noqa: E402


def excluded_keys(paths: list[str]) -> QuestionKeys:
    """The questions of `paths` (question JSONL files), to tell a question of theirs by id or normalised text."""
    return QuestionKeys(read_questions(paths)[0] if paths else [])


def unseen(path: Path, seen: QuestionKeys) -> list[Question]:
    """A dev file's questions in sha1-of-id order, without those `seen` holds."""
    return [q for q in sha1_order(read_file(path)) if not seen.matches(q)]


def shown(path: Path) -> str:
    """A path as the manifest records it: relative to the repository (../shared/data/...), never this machine's."""
    return os.path.relpath(Path(path).resolve(), ROOT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exclude", action="append", default=[], help="question files never to draw from")
    parser.add_argument("--index", required=True, help="the index folder the runs search")
    parser.add_argument("--data", type=Path, default=DATA, help="folder with dev/ (../shared/data)")
    parser.add_argument("--per-dataset", type=int, default=120, help="kept questions per dataset, at most")
    parser.add_argument("--k", type=int, default=3, help="passages the agent is shown (the run's K)")
    parser.add_argument("--top-n", type=int, default=5, help="retrieved passages whose titles count (the run's N)")
    parser.add_argument("--passage-tokens", type=int, default=48, help="tokens of a passage the agent reads")
    parser.add_argument("--out", required=True, help="where to write the kept questions (JSONL)")
    args = parser.parse_args()

    from cosearch_cli.index.build import open_index
    from cosearch_cli.models import load_tokenizer

    seen = excluded_keys(args.exclude)
    tokenizer = load_tokenizer("smollm2")
    index = open_index(args.index)
    retriever = index.retriever()
    dev_files = sorted((args.data / "dev").glob("*.jsonl"))
    kept, counts = [], {}
    for path in dev_files:
        candidates = unseen(path, seen)
        mine, looked = [], 0
        for start in range(0, len(candidates), 64):
            if len(mine) >= args.per_dataset:
                break
            batch = candidates[start:start + 64]
            for q, hits in zip(batch, retriever.search([q.question for q in batch], args.top_n)):
                looked += 1
                passages = index.docs.get([h.id for h in hits])
                answers = [str(a) for a in q.answers]
                if len(mine) < args.per_dataset and answerable(
                        answers, [p.text for p in passages], [p.title for p in passages], k=args.k,
                        tokenizer=tokenizer, passage_tokens=args.passage_tokens):
                    mine.append(q)
                    seen.add(q)  # an identical text later in another file is not drawn twice
        counts[path.stem] = {"candidates": len(candidates), "looked_at": looked, "kept": len(mine)}
        kept += mine
    inputs = {shown(p): file_sha256(p) for p in [*dev_files, *map(Path, args.exclude)]}
    options = {key: shown(value) if isinstance(value, Path) else value for key, value in vars(args).items()
               if key != "out"}
    manifest = make_manifest("answerable_pool", options=options | {"counts": counts}, inputs=inputs)
    with Writer(args.out, manifest=manifest) as w:
        w.write_all(row(q) for q in kept)
    print(orjson.dumps({"kept": len(kept), "per_dataset": counts}, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
