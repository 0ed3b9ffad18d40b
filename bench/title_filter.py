"""Training questions without the title shortcut (issue 14, study 4): drop those whose gold answer is the title
of a passage the retriever returns for the question itself.

    .venv/bin/python bench/title_filter.py --questions runs/study3/train.jsonl --index indexes/dev-bm25 \
        --top-n 5 --out runs/study4/train.jsonl [--report runs/study3/heldout.jsonl]

Study 3 found the RL updates reinforcing answers that copy a shown passage's title (bench/title_copy.py): on a
training question whose gold entity is such a title, a copy earns full reward without reading the passage, and
on held-out questions the extra copies earned nothing. A question is dropped when a normalised gold answer (SQuAD
normalisation, as EM uses) equals the normalised title of one of the retriever's top-N passages for the
question's text, with or without a trailing "(...)" qualifier. The agent's first query is most often the
question verbatim, so these are the passages it will be shown. This selects training data with the gold
answers, as pass-rate filtering does; the reward, grouping and updates are METHOD.md's, unchanged.
`--report FILE` only counts how many questions of FILE (e.g. the held-out set) the rule would drop; it never
filters them. Writes the kept questions, a manifest beside them (with the counts), and prints the counts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cosearch_cli.answerable import answer_is_title  # noqa: E402
from cosearch_cli.artifacts import Writer, file_sha256, make_manifest  # noqa: E402
from cosearch_cli.index.build import open_index  # noqa: E402


def flags(rows: list[dict], index, top_n: int) -> list[bool]:
    """Per question: whether a gold answer is the title of one of the retriever's top-N for its text."""
    hits = index.retriever().search([r["question"] for r in rows], top_n)
    out = []
    for row, found in zip(rows, hits):
        titles = [p.title for p in index.docs.get([h.id for h in found])]
        out.append(answer_is_title([str(a) for a in row["answers"]], titles))
    return out


def read_rows(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", required=True, help="training questions (JSONL) to filter")
    parser.add_argument("--index", required=True, help="the index folder the runs search")
    parser.add_argument("--top-n", type=int, default=5, help="retrieved passages whose titles count (the run's N)")
    parser.add_argument("--out", required=True, help="where to write the kept questions (JSONL)")
    parser.add_argument("--report", nargs="*", default=[], help="question files to count, never filter")
    args = parser.parse_args()
    index = open_index(args.index)
    rows = read_rows(Path(args.questions))
    dropped = flags(rows, index, args.top_n)
    kept = [r for r, d in zip(rows, dropped) if not d]
    counts = {"questions": len(rows), "dropped": sum(dropped), "kept": len(kept)}
    for name in args.report:
        other = flags(read_rows(Path(name)), index, args.top_n)
        counts[f"report:{name}"] = f"{sum(other)} of {len(other)} would be dropped"
    manifest = make_manifest("title_filter", options={**vars(args), "counts": counts},
                             inputs={args.questions: file_sha256(args.questions)})
    with Writer(args.out, manifest=manifest) as w:
        w.write_all(kept)
    print(orjson.dumps(counts, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
