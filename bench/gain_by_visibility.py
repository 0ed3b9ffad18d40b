"""A held-out F1 change split by whether the starting agent was shown a gold answer (issue 14, study 8).

    .venv/bin/python bench/gain_by_visibility.py --start runs/s8-cosearch/eval-init/rollouts.jsonl \
        --end runs/s8-cosearch/iter-0005/eval/rollouts.jsonl --index indexes/dev-bm25 [--passage-tokens 48] \
        [--split NAME=QUESTIONS.jsonl] [--shown-from ROLLOUTS.jsonl] [--json out.json]

Study 8 trains on questions whose answer the agent is shown; this asks where on the held-out questions its
change lands. A held-out question counts as "shown" when a gold answer (DPR-style has_answer) lies within the
first `--passage-tokens` tokens of a passage its starting agent was shown (the greedy evaluation before
training: the split depends on the start only, never on the trained model). Per subset: questions, F1 at the
start and at the end, and the paired bootstrap 95% CI of the change (cosearch_cli/gains.py: questions
resampled within each dataset, averaged over datasets). Post-hoc: it reads an evaluation already made, and
selects nothing that was trained or tuned on. No model is loaded.

`--split NAME=FILE` (repeatable) adds two subsets fixed before the run: the held-out questions whose id is in the
question JSONL FILE (NAME), and the others (`not NAME`); study 11 reports study 8's 210 questions within its 630
this way.

`--shown-from` takes the split from another evaluation of the starting models (e.g. the greedy one, when
`--start` and `--end` are sampled: study 11's sampled evaluation splits as its greedy one did).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from evidence_in_view import answer_in_view  # noqa: E402
from question_overlap import question_ids  # noqa: E402


def shown_ids(records, docs, tokenizer, passage_tokens: int) -> set[str]:
    """Question ids whose (first) trajectory was shown a gold answer within `passage_tokens` of a passage."""
    out = set()
    for record in records:
        ids = [i for turn in record.trajectories[0].turns for i in (turn.observation_ids or [])]
        texts = [p.text for p in docs.get(ids)] if ids else []
        if any(answer_in_view(tokenizer, record.answers, texts, passage_tokens)):
            out.add(record.question_id)
    return out


def subsets(shown: set[str], splits: dict[str, set[str]]) -> dict:
    """Name -> test on a question id: all, answer shown or not, and for each split its ids and the others."""
    out = {"all": lambda q: True, "answer shown": lambda q: q in shown, "answer not shown": lambda q: q not in shown}
    for name, ids in splits.items():
        out[name] = lambda q, ids=ids: q in ids
        out[f"not {name}"] = lambda q, ids=ids: q not in ids
    return out


def read_split(item: str) -> tuple[str, set[str]]:
    """`NAME=FILE` -> NAME and the ids of FILE's questions."""
    name, _, path = item.partition("=")
    if not name or not path:
        raise SystemExit(f"--split {item!r}: write NAME=QUESTIONS.jsonl")
    return name, question_ids(Path(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", required=True, help="held-out evaluation before training (rollouts.jsonl)")
    parser.add_argument("--end", required=True, help="the same questions' evaluation after training")
    parser.add_argument("--index", required=True, help="the index the evaluations searched")
    parser.add_argument("--passage-tokens", type=int, default=48, help="tokens of a passage the agent reads")
    parser.add_argument("--split", action="append", default=[],
                        help="NAME=QUESTIONS.jsonl: also report the questions in that file and the others")
    parser.add_argument("--shown-from", help="evaluation of the start that decides 'shown' (default: --start)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()

    from cosearch_cli.gains import compare_runs
    from cosearch_cli.index.build import open_index
    from cosearch_cli.models import load_tokenizer
    from cosearch_cli.train import read_records

    start, end = read_records(Path(args.start)), read_records(Path(args.end))
    shown_from = read_records(Path(args.shown_from)) if args.shown_from else start
    if {r.question_id for r in shown_from} != {r.question_id for r in start}:
        raise SystemExit(f"{args.shown_from}: not the questions of {args.start}")
    shown = shown_ids(shown_from, open_index(args.index).docs, load_tokenizer("smollm2"), args.passage_tokens)
    figures = {"command": "python bench/gain_by_visibility.py " + " ".join(sys.argv[1:]), "subsets": {}}
    for name, keep in subsets(shown, dict(map(read_split, args.split))).items():
        a = [r for r in start if keep(r.question_id)]
        b = [r for r in end if keep(r.question_id)]
        f = compare_runs(a, b)
        figures["subsets"][name] = {k: f[k] for k in ("questions", "agent_f1_before", "agent_f1_after",
                                                      "agent_f1_gain", "agent_f1_gain_ci")}
    for name, f in figures["subsets"].items():
        low, high = f["agent_f1_gain_ci"]
        print(f"{name}: {f['questions']} questions, F1 {f['agent_f1_before']:.3f} -> {f['agent_f1_after']:.3f}, "
              f"{f['agent_f1_gain']:+.3f} [{low:+.3f}, {high:+.3f}]")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
