"""Question files for the learning-evidence runs (issues 7 and 14): training and evaluation never overlap.

Issue 7's split (the default): evaluation is the first `--eval-per-dataset` questions of each
../shared/data/dev file in sha1-of-id order (the same questions `bench/valid_actions.py` evaluates on).
Training: the next `--train-dev-per-dataset` dev questions of each file in that order, plus the first
`--train-extra-per-file` questions of each ../shared/data/extra_qa_only file in the same order (their passages
are not in the corpus, so they teach searching and answering under retrieval misses, as in the paper's mix).

    .venv/bin/python bench/learning_split.py --out runs/learning

Issue 14's held-out set (`--heldout N`, e.g. 210): N dev questions stratified over the 7 datasets
(cosearch_cli/splits.py: equal shares, a dataset with fewer questions gives all it has and the others share
the rest; bamboogle has 25), none of them a question of an `--exclude` file (a warm-up's questions: a question
JSONL, or the `warmup.json` that `bench/valid_actions.py --save-warmup` writes, whose ids are looked up in
dev), by id or normalised text. It is written to `heldout.jsonl` with `heldout.manifest.json` (input hashes,
options, per-dataset counts). Training is then drawn as above from the dev questions not held out, plus the
extra files' questions whose text is not held out, to `train.jsonl` (+ manifest); no `eval.jsonl` is written.

    .venv/bin/python bench/learning_split.py --heldout 210 --exclude runs/warmup-smollm2/warmup.json \
        --out runs/study

`--warmup N` moves N of the training dev questions (round-robin over the datasets; the extra files' questions
have no passages in the corpus, so they give no demonstration) to `warmup.jsonl`: the supervised warm-up that
every preset of the study starts from trains on them, and RL never draws them.

`--more-warmup N` also writes `warmup_more.jsonl`: the next N dev questions of each dataset in sha1 order after
the training ones (so never held out, never trained on by RL, never in warmup.jsonl), for a warm-up with more
demonstrations than warmup.jsonl gives (issue 14's ranker lever). The other files do not change.

`--subset FILE` (one training-question id per line) also writes `subset.jsonl`: those training questions only,
for the fixed-set check that GRPO raises the reward on the questions it trains on (learning_overfit.toml).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import orjson

from cosearch_cli.artifacts import Writer, file_sha256, make_manifest
from cosearch_cli.records import Question, read_question
from cosearch_cli.splits import QuestionKeys, draw_heldout, sha1_order
from cosearch_cli.warmup import check_no_overlap

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def read_file(path: Path) -> list[Question]:
    return [read_question(orjson.loads(line), str(path), i + 1)
            for i, line in enumerate(path.read_bytes().splitlines()) if line.strip()]


def excluded_questions(paths: list[str], dev: dict[str, Question]) -> list[Question]:
    """Questions of question JSONL files, or of a warm-up's `warmup.json` (ids of dev questions)."""
    out = []
    for name in paths:
        path = Path(name)
        if path.suffix == ".json":
            ids = orjson.loads(path.read_bytes())["train_question_ids"]
            missing = [i for i in ids if i not in dev]
            assert not missing, f"{path}: ids not among the dev questions: {missing[:5]}"
            out += [dev[i] for i in ids]
        else:
            out += read_file(path)
    return out


def row(q: Question) -> dict:
    """The question as the shared data writes it (its extra fields back at the top level)."""
    data = {"id": q.id, "question": q.question, "answers": q.answers, "dataset": q.dataset,
            "supporting_titles": q.supporting_titles}
    return data | q.extra


def write(path: Path, questions: list[Question], manifest: dict) -> None:
    with Writer(path, manifest=manifest) as out:
        out.write_all(row(q) for q in questions)
    print(f"{path}: {len(questions)} questions")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval-per-dataset", type=int, default=15)
    ap.add_argument("--train-dev-per-dataset", type=int, default=30)
    ap.add_argument("--train-extra-per-file", type=int, default=30)
    ap.add_argument("--heldout", type=int, default=0,
                    help="draw this many held-out questions stratified over the datasets (issue 14) instead of "
                         "--eval-per-dataset")
    ap.add_argument("--exclude", action="append", default=[],
                    help="questions the held-out set must not contain (warm-up questions); repeatable")
    ap.add_argument("--data", type=Path, default=DATA, help="folder with dev/ and extra_qa_only/ (../shared/data)")
    ap.add_argument("--out", default="runs/learning")
    ap.add_argument("--warmup", type=int, default=0,
                    help="move this many training dev questions, round-robin over the datasets, to warmup.jsonl "
                         "(a supervised warm-up's questions, never rolled out by RL nor evaluated)")
    ap.add_argument("--more-warmup", type=int, default=0,
                    help="with --heldout: write the next N dev questions per dataset after the training ones to "
                         "warmup_more.jsonl (more warm-up demonstrations)")
    ap.add_argument("--subset", help="file of training-question ids (one per line) to write as subset.jsonl")
    args = ap.parse_args()
    dev_files = sorted((args.data / "dev").glob("*.jsonl"))
    extra_files = sorted((args.data / "extra_qa_only").glob("*.jsonl"))
    by_dataset = {path.stem: read_file(path) for path in dev_files}
    if args.heldout:
        dev = {q.id: q for qs in by_dataset.values() for q in qs}
        excluded = excluded_questions(args.exclude, dev)
        evaluation, counts = draw_heldout(by_dataset, args.heldout, QuestionKeys(excluded))
        held = QuestionKeys(evaluation)
        train, more = [], []
        for questions in by_dataset.values():
            kept = [q for q in sha1_order(questions) if not held.matches(q)]
            train += kept[:args.train_dev_per_dataset]
            more += kept[args.train_dev_per_dataset:args.train_dev_per_dataset + args.more_warmup]
        for path in extra_files:
            train += [q for q in sha1_order(read_file(path)) if not held.matches(q)][:args.train_extra_per_file]
        check_no_overlap(excluded, evaluation)
    else:
        assert not args.exclude and not args.more_warmup, "--exclude and --more-warmup apply to --heldout"
        evaluation, train, counts, more = [], [], None, []
        for questions in by_dataset.values():
            ordered = sha1_order(questions)
            evaluation += ordered[:args.eval_per_dataset]
            train += ordered[args.eval_per_dataset:args.eval_per_dataset + args.train_dev_per_dataset]
        for path in extra_files:
            train += sha1_order(read_file(path))[:args.train_extra_per_file]
    check_no_overlap(train, evaluation)
    warmup = []
    if args.warmup:
        from cosearch_cli.train import eval_questions

        dev_ids = {q.id for qs in by_dataset.values() for q in qs}
        warmup = eval_questions([q for q in train if q.id in dev_ids], args.warmup)
        taken = {q.id for q in warmup}
        train = [q for q in train if q.id not in taken]
        check_no_overlap(warmup, evaluation)

    # paths as given or relative to the working directory: the default --data resolves to an absolute path,
    # which would make manifests name one machine's folders
    inputs = {os.path.relpath(p): file_sha256(p) for p in [*dev_files, *extra_files, *map(Path, args.exclude)]}
    options = {key: os.path.relpath(value) if isinstance(value, Path) else value for key, value in vars(args).items()
               if key != "out"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    eval_name = "heldout.jsonl" if args.heldout else "eval.jsonl"
    write(out / eval_name, evaluation, make_manifest("learning-split", options | {"role": "evaluation"},
                                                     inputs=inputs) | {"datasets": counts})
    write(out / "train.jsonl", train, make_manifest("learning-split", options | {"role": "training"}, inputs=inputs))
    if warmup:
        write(out / "warmup.jsonl", warmup, make_manifest("learning-split", options | {"role": "warm-up"},
                                                          inputs=inputs))
    if more:
        used = QuestionKeys(train + warmup)  # a dev question whose text an extra-file training question repeats
        more = [q for q in more if not used.matches(q)]
        check_no_overlap(more, evaluation)
        write(out / "warmup_more.jsonl", more, make_manifest("learning-split", options | {"role": "warm-up (more)"},
                                                             inputs=inputs))
    if args.subset:
        wanted = [line.split("#")[0].strip() for line in Path(args.subset).read_text().splitlines()]
        by_id = {q.id: q for q in train}
        missing = [i for i in wanted if i and i not in by_id]
        assert not missing, f"not training questions: {missing}"
        write(out / "subset.jsonl", [by_id[i] for i in wanted if i],
              make_manifest("learning-split", options | {"role": "subset"}, inputs=inputs))


if __name__ == "__main__":
    main()
