"""How often the agent answers with the title of a passage it was shown, or repeats the question, in the
trajectories a training run rewarded and penalised (issue 14: the title shortcut found in learning study 3, which
study 4 removed from its training questions with bench/title_filter.py; the question repeats that grew in study 5).

    .venv/bin/python bench/title_copy.py runs/learn-search-r1 runs/learn-fixed-ranker runs/learn-cosearch \
        [--eval start=runs/learn-cosearch/eval-init/rollouts.jsonl ...] [--data ../shared/data] \
        [--out bench/results/title_copy.md]

A trajectory copies a title when its normalised answer (SQuAD normalisation, as EM uses) equals the
normalised title of a passage shown to it in any turn. It repeats the question when its normalised answer has
at least 4 words and at least 80% of them occur in the normalised question. Read from every iteration's
scored.jsonl: the trajectories of kept agent groups carry their advantage (positive: reinforced, negative:
discouraged); the others have advantage 0 or none. --eval NAME=ROLLOUTS adds held-out greedy evaluations: how
many answers copy a title, and how many of those and of the others are exact matches; and against the first
--eval, how many answers and queries changed and how many changed answers score a higher or lower F1. No model
is loaded.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_io import write_results  # noqa: E402

from cosearch_cli.metrics import exact_match, normalize_answer, token_f1  # noqa: E402


def corpus_titles(data: Path) -> dict[str, str]:
    """Passage id -> normalised title, read as `cosearch index` reads a corpus (either row format)."""
    from cosearch_cli.index.corpus import Corpus

    files = [str(path) for path in sorted((data / "corpus").glob("*.jsonl"))]
    return {passage.id: normalize_answer(passage.title) for passage in Corpus(files)}


def copies_title(trajectory: dict, titles: dict[str, str]) -> bool:
    if trajectory.get("answer") is None:
        return False
    shown = {titles.get(pid, "") for turn in trajectory["turns"] for pid in (turn.get("observation_ids") or [])}
    return normalize_answer(trajectory["answer"]) in shown - {""}


def repeats_question(answer: str | None, question: str) -> bool:
    """The answer is mostly the question's own words: >= 4 words, >= 80% of them in the question (normalised)."""
    words = normalize_answer(answer or "").split()
    asked = set(normalize_answer(question).split())
    return len(words) >= 4 and sum(word in asked for word in words) >= 0.8 * len(words)


def count(run: Path, titles: dict[str, str]) -> dict:
    c = dict(trajectories=0, copies=0, reinforced=0, reinforced_copies=0, discouraged=0, discouraged_copies=0,
             rewarded=0, rewarded_copies=0, repeats=0, reinforced_repeats=0, iterations=0)
    for scored in sorted(run.glob("iter-*/scored.jsonl")):
        c["iterations"] += 1
        with scored.open("rb") as f:
            for line in f:
                record = orjson.loads(line)
                for t in record["trajectories"]:
                    copy = copies_title(t, titles)
                    repeat = repeats_question(t.get("answer"), record["question"])
                    advantage = t.get("advantage") or 0.0
                    c["trajectories"] += 1
                    c["copies"] += copy
                    c["repeats"] += repeat
                    if advantage > 0:
                        c["reinforced"] += 1
                        c["reinforced_copies"] += copy
                        c["reinforced_repeats"] += repeat
                    elif advantage < 0:
                        c["discouraged"] += 1
                        c["discouraged_copies"] += copy
                    if (t.get("reward") or 0) > 0:
                        c["rewarded"] += 1
                        c["rewarded_copies"] += copy
    return c


def held_out(rollouts: Path, titles: dict[str, str]) -> tuple[dict, dict]:
    """Counts of one held-out evaluation, and per question (answer, queries, F1) for comparing evaluations."""
    c = dict(answers=0, copies=0, copies_exact=0, others_exact=0, repeats=0)
    answers = {}
    with rollouts.open("rb") as f:
        for line in f:
            record = orjson.loads(line)
            for t in record["trajectories"]:
                copy = copies_title(t, titles)
                exact = t.get("answer") is not None and exact_match(t["answer"], record["answers"]) > 0
                c["answers"] += 1
                c["copies"] += copy
                c["repeats"] += repeats_question(t.get("answer"), record["question"])
                c["copies_exact" if copy else "others_exact"] += exact
                answers[(record["question_id"], t.get("sample", 0))] = (
                    t.get("answer"), [turn.get("query") for turn in t["turns"]],
                    token_f1(t.get("answer") or "", record["answers"]))
    return c, answers


def changes(before: dict, after: dict) -> dict:
    """How many answers (and queries) of `after` differ from `before` on the same questions, and how many of the
    changed answers score a higher or a lower F1."""
    changed = [k for k in before if before[k][0] != after[k][0]]
    return {"answers_changed": len(changed), "f1_higher": sum(after[k][2] > before[k][2] for k in changed),
            "f1_lower": sum(after[k][2] < before[k][2] for k in changed),
            "queries_changed": sum(before[k][1] != after[k][1] for k in before)}


def share(part: int, whole: int) -> str:
    return f"{part}/{whole} ({part / whole:.0%})" if whole else "0/0"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--data", type=Path, default=Path("../shared/data"))
    ap.add_argument("--eval", action="append", default=[], metavar="NAME=ROLLOUTS",
                    help="a held-out evaluation's rollouts.jsonl to count (repeatable)")
    ap.add_argument("--out", default=None, help="results Markdown to write (with its .json twin)")
    args = ap.parse_args()
    titles = corpus_titles(args.data)
    rows = {run.name: count(run, titles) for run in args.runs}
    lines = ["# Title copies and question repeats in the trajectories training reinforced "
             "(issue 14 learning studies)", "",
             "Command: `.venv/bin/python bench/title_copy.py " + " ".join(str(r) for r in args.runs)
             + "".join(f" --eval {shlex.quote(e)}" for e in args.eval)
             + (f" --out {args.out}" if args.out else "") + "` (reads the runs' rollouts; no model, no timing).", "",
             "A trajectory copies a title when its normalised answer equals the normalised title of a passage it "
             "was shown. It repeats the question when its normalised answer has at least 4 words and at least 80% of "
             "them occur in the normalised question. Reinforced: positive advantage in a kept agent group; "
             "discouraged: negative.", "",
             "| run | iterations | trajectories | copy a title | reinforced that copy | discouraged that copy | "
             "rewarded (reward > 0) that copy | repeat the question | reinforced that repeat |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, c in rows.items():
        lines.append(f"| {name} | {c['iterations']} | {c['trajectories']} | {share(c['copies'], c['trajectories'])} | "
                     f"{share(c['reinforced_copies'], c['reinforced'])} | "
                     f"{share(c['discouraged_copies'], c['discouraged'])} | "
                     f"{share(c['rewarded_copies'], c['rewarded'])} | {share(c['repeats'], c['trajectories'])} | "
                     f"{share(c['reinforced_repeats'], c['reinforced'])} |")
    evals, answers = {}, {}
    for item in args.eval:
        name, _, path = item.partition("=")
        evals[name], answers[name] = held_out(Path(path), titles)
    if evals:
        first = next(iter(answers))
        for name in evals:
            evals[name] |= changes(answers[first], answers[name])
        lines += ["", f"Held-out greedy evaluations (the same questions for each; changes against {first}):", "",
                  "| evaluation | answers | copy a title | exact among copies | exact among the others "
                  "| repeat the question | answers changed | of those, F1 higher | F1 lower | queries changed |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for name, c in evals.items():
            others = c["answers"] - c["copies"]
            lines.append(f"| {name} | {c['answers']} | {c['copies']} | {share(c['copies_exact'], c['copies'])} | "
                         f"{share(c['others_exact'], others)} | {c['repeats']} | {c['answers_changed']} | "
                         f"{c['f1_higher']} | {c['f1_lower']} | {c['queries_changed']} |")
    write_results(args.out, "\n".join(lines) + "\n", {"runs": rows, "held_out": evals})


if __name__ == "__main__":
    main()
