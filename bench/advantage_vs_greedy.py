"""What a run's agent updates rewarded, measured against the starting model's greedy answer (issue 14, study 11).

    .venv/bin/python bench/advantage_vs_greedy.py --run runs/s11-cosearch \
        --greedy runs/s11-sampled/drawn-greedy-start.jsonl [--json out.json]

GRPO rewards the samples of a group that beat the group's mean. When samples score below the greedy answer on
average, the samples it rewards may be mostly those that give the greedy answer: the update then sharpens the
policy towards that answer instead of changing it. This counts it on the agent groups the run trained on
(`iter-*/scored.jsonl`, groups marked kept): the share of samples with a positive advantage, and of those with a
negative one, whose answer is the greedy answer (normalised as EM normalises; two missing answers agree), and how
many rewarded samples beat the greedy answer's F1. `--greedy` holds greedy rollouts of the *starting* model on
the drawn questions (`bench/drawn_split.py`); iterations after the first sampled from updated models, which moved
little (held-out KL per update ~1e-4), so for them the start's greedy answer stands in for their own.
No model is loaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from greedy_agreement import normalised_answer  # noqa: E402


def greedy_answers(records) -> dict[str, tuple[str | None, float]]:
    """Question id -> (normalised greedy answer, its token F1)."""
    from cosearch_cli.metrics import answer_scores

    return {record.question_id: (normalised_answer(record.trajectories[0].answer),
                                 answer_scores(record.trajectories[0].answer, record.answers)["f1"])
            for record in records}


def rewarded(records, greedy: dict[str, tuple[str | None, float]]) -> dict:
    """Counts over the trajectories of kept agent groups: by the sign of their advantage, how many give the
    greedy answer, and how many score above its F1."""
    counts = {sign: {"samples": 0, "greedy_answer": 0, "above_greedy_f1": 0} for sign in ("positive", "negative")}
    groups = beatable = 0
    for record in records:
        kept = {g.id for g in record.groups if g.role == "agent" and g.kept}
        if not kept:
            continue
        if record.question_id not in greedy:
            raise SystemExit(f"question {record.question_id} has no greedy rollout: pass the drawn questions' run")
        target, target_f1 = greedy[record.question_id]
        members = [t for t in record.trajectories if t.group in kept]
        groups += 1
        beatable += any(t.scores["f1"] > target_f1 for t in members)
        for t in members:
            if t.advantage == 0:
                continue
            c = counts["positive" if t.advantage > 0 else "negative"]
            c["samples"] += 1
            c["greedy_answer"] += normalised_answer(t.answer) == target
            c["above_greedy_f1"] += t.scores["f1"] > target_f1
    for c in counts.values():
        for key in ("greedy_answer", "above_greedy_f1"):
            c[f"{key}_share"] = c[key] / c["samples"] if c["samples"] else None
    return {"groups": groups, "groups_with_a_sample_above_greedy_f1": beatable, **counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, type=Path, help="a `cosearch train` run folder")
    parser.add_argument("--greedy", required=True, type=Path,
                        help="greedy rollouts of the starting model on the drawn questions")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    from cosearch_cli.train import read_records

    files = sorted(args.run.glob("iter-*/scored.jsonl"))
    if not files:
        raise SystemExit(f"{args.run}: no iter-*/scored.jsonl; pass the folder of a `cosearch train` run")
    figures = {"command": "python bench/advantage_vs_greedy.py " + " ".join(sys.argv[1:]),
               **rewarded([r for path in files for r in read_records(path)], greedy_answers(read_records(args.greedy)))}
    for sign in ("positive", "negative"):
        c = figures[sign]
        print(f"{sign} advantage: {c['samples']} samples, {c['greedy_answer']} give the greedy answer, "
              f"{c['above_greedy_f1']} score above its F1")
    print(f"{figures['groups']} groups, {figures['groups_with_a_sample_above_greedy_f1']} with a sample above "
          "the greedy answer's F1")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
