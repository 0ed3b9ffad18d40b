"""A fresh held-out set for a confirmatory check (issue 14): dev questions that no study's split has touched.

Every split of the studies (bench/learning_split.py, bench/answerable_pool.py) takes a dataset's questions from
the front of its sha1-of-id order; this takes them from the back. It writes `--per-dataset` questions of each
`--datasets` dev file, last in sha1 order first, none of them (by id or normalised text) a question of an
`--exclude` file (the warm-ups', training pools' and earlier held-out sets' question JSONL), so a figure judged
on them was never looked at, trained on or tuned on before.

    .venv/bin/python bench/fresh_heldout.py --datasets nq,triviaqa,popqa --per-dataset 200 \
        --exclude runs/study3/warmup.jsonl --exclude runs/study11/train.jsonl ... --out runs/fresh/single-hop.jsonl

The manifest records the options, the input hashes and, per dataset, how many questions it had, how many the
exclusion removed and how many were taken. Same inputs, same file.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_split import DATA, read_file, write  # noqa: E402

from cosearch_cli.artifacts import file_sha256, make_manifest  # noqa: E402
from cosearch_cli.records import Question  # noqa: E402
from cosearch_cli.splits import QuestionKeys, sha1_order  # noqa: E402
from cosearch_cli.warmup import check_no_overlap  # noqa: E402


def fresh(by_dataset: dict[str, list[Question]], per_dataset: int,
          excluded: QuestionKeys) -> tuple[list[Question], dict]:
    """`per_dataset` questions of each dataset from the back of its sha1 order, none of them excluded; also how
    many each dataset had, lost to the exclusion and gave."""
    chosen, counts = [], {}
    for dataset, questions in by_dataset.items():
        kept = [q for q in reversed(sha1_order(questions)) if not excluded.matches(q)]
        if len(kept) < per_dataset:
            raise SystemExit(f"{dataset}: only {len(kept)} questions left after the exclusions, "
                             f"{per_dataset} asked for; ask for fewer")
        chosen += kept[:per_dataset]
        counts[dataset] = {"questions": len(questions), "excluded": len(questions) - len(kept),
                           "drawn": per_dataset}
    return chosen, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", required=True, help="comma-separated dev file stems, e.g. nq,triviaqa,popqa")
    ap.add_argument("--per-dataset", type=int, required=True, help="questions taken from each dataset")
    ap.add_argument("--exclude", action="append", default=[], help="question JSONL whose questions are not taken")
    ap.add_argument("--data", type=Path, default=DATA, help="folder with dev/ (../shared/data)")
    ap.add_argument("--out", required=True, help="the question JSONL to write (with its .manifest.json)")
    args = ap.parse_args()
    dev_files = [args.data / "dev" / f"{name}.jsonl" for name in args.datasets.split(",")]
    missing = [str(p) for p in dev_files if not p.is_file()]
    if missing:
        raise SystemExit(f"no such dev file: {', '.join(missing)}; --datasets names files of {args.data / 'dev'}")
    excluded = [q for path in args.exclude for q in read_file(Path(path))]
    chosen, counts = fresh({p.stem: read_file(p) for p in dev_files}, args.per_dataset, QuestionKeys(excluded))
    check_no_overlap(excluded, chosen)
    inputs = {os.path.relpath(p): file_sha256(p) for p in [*dev_files, *map(Path, args.exclude)]}
    options = {key: os.path.relpath(value) if isinstance(value, Path) else value
               for key, value in vars(args).items() if key != "out"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write(out, chosen, make_manifest("fresh-heldout", options, inputs=inputs) | {"datasets": counts})


if __name__ == "__main__":
    main()
