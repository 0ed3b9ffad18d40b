"""How often a model's sampled answers are its own greedy answer, before and after training (issue 14, study 11).

    .venv/bin/python bench/greedy_agreement.py \
        --start runs/s11-sampled/start.jsonl,runs/s11-cosearch/eval-init/rollouts.jsonl \
        --end runs/s11-sampled/end.jsonl,runs/s11-cosearch/iter-0005/eval/rollouts.jsonl [--json out.json]

Each side is SAMPLED,GREEDY: rollouts of one model on the same questions, sampled and greedy. A sampled
trajectory agrees when its answer, normalised as EM normalises (SQuAD style), is the greedy trajectory's; two
missing answers (format failures) agree too. A question's agreement is the share of its samples that agree;
the figure is the unweighted mean over datasets, and end - start gets the paired bootstrap 95% CI every study
uses (cosearch_cli.evaluate.paired_bootstrap: questions resampled within each dataset). A policy that RL
sharpens towards its mode samples its greedy answer more often; one that learns a new answer need not.
The sampled F1 is split the same way, in two parts that add up to it: the F1 of the samples that give the
model's greedy answer and that of the others (each summed over its samples and divided by all of them), so the
F1 gain splits into the two parts' gains.
No model is loaded.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def normalised_answer(answer: str | None) -> str | None:
    """An answer as EM compares it (SQuAD normalisation); a missing answer (format failure) stays None."""
    from cosearch_cli.metrics import normalize_answer

    return None if answer is None else normalize_answer(answer)


def _with_greedy_answer(sampled, greedy):
    """Each sampled record with its question's normalised greedy answer; every question must have one."""
    greedy_answer = {r.question_id: normalised_answer(r.trajectories[0].answer) for r in greedy}
    for record in sampled:
        if record.question_id not in greedy_answer:
            raise SystemExit(f"question {record.question_id} has no greedy rollout: pass the same questions' runs")
        yield record, greedy_answer[record.question_id]


def agreement(sampled, greedy) -> dict[str, tuple[str, float]]:
    """Question id -> (dataset, share of its sampled trajectories whose answer is the greedy one)."""
    return {record.question_id: (record.dataset,
                                 float(np.mean([normalised_answer(t.answer) == target for t in record.trajectories])))
            for record, target in _with_greedy_answer(sampled, greedy)}


def f1_parts(sampled, greedy) -> tuple[dict[str, tuple[str, float]], dict[str, tuple[str, float]]]:
    """A question's sampled F1 (the mean over its samples) split in two parts that add up to it: the samples
    that give the greedy answer, and the others (each part: its samples' F1 summed, over all samples)."""
    from cosearch_cli.metrics import answer_scores

    same, other = {}, {}
    for record, target in _with_greedy_answer(sampled, greedy):
        parts = [0.0, 0.0]
        for t in record.trajectories:
            f1 = answer_scores(t.answer, record.answers)["f1"]
            parts[normalised_answer(t.answer) != target] += f1 / len(record.trajectories)
        same[record.question_id], other[record.question_id] = (record.dataset, parts[0]), (record.dataset, parts[1])
    return same, other


def by_dataset(shares: dict[str, tuple[str, float]], ids: list[str]) -> dict[str, np.ndarray]:
    grouped = defaultdict(list)
    for qid in ids:
        dataset, value = shares[qid]
        grouped[dataset].append(value)
    return {d: np.asarray(v) for d, v in grouped.items()}


def compare(start: dict, end: dict, name: str = "agreement", samples: int = 1000, seed: int = 0) -> dict:
    """A per-question figure's mean (over datasets) at the start and at the end (`NAME_before`, `NAME_after`),
    and end - start with its paired CI."""
    from cosearch_cli.evaluate import paired_bootstrap

    if set(start) != set(end):
        raise SystemExit("start and end hold different questions: pass the same questions' runs")
    ids = sorted(start)
    before, after = by_dataset(start, ids), by_dataset(end, ids)
    stats = paired_bootstrap({d: after[d] - before[d] for d in before}, samples=samples, seed=seed)["average"]
    return {"questions": len(ids), f"{name}_before": float(np.mean([v.mean() for v in before.values()])),
            f"{name}_after": float(np.mean([v.mean() for v in after.values()])), "gain": stats["diff"],
            "gain_ci": [stats["ci_low"], stats["ci_high"]],
            "bootstrap": {"samples": samples, "seed": seed, "resampling": "questions within each dataset, paired"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", required=True, help="SAMPLED,GREEDY rollouts of the model before training")
    parser.add_argument("--end", required=True, help="SAMPLED,GREEDY rollouts of the trained model")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    from cosearch_cli.train import read_records

    sides, parts = {}, {}
    for name, item in (("start", args.start), ("end", args.end)):
        paths = item.split(",")
        if len(paths) != 2:
            raise SystemExit(f"--{name} {item!r}: write SAMPLED.jsonl,GREEDY.jsonl")
        sampled, greedy = (read_records(Path(p)) for p in paths)
        sides[name], parts[name] = agreement(sampled, greedy), f1_parts(sampled, greedy)
    figures = {"command": "python bench/greedy_agreement.py " + " ".join(sys.argv[1:]),
               **compare(sides["start"], sides["end"])}
    for i, key in enumerate(("f1_from_greedy_answer", "f1_from_other_answers")):
        f = figures[key] = compare(parts["start"][i], parts["end"][i], name="f1")
        print(f"sampled F1 from samples that {'give' if i == 0 else 'do not give'} the model's greedy answer: "
              f"{f['f1_before']:.3f} -> {f['f1_after']:.3f}, {f['gain']:+.3f} "
              f"[{f['gain_ci'][0]:+.3f}, {f['gain_ci'][1]:+.3f}]")
    low, high = figures["gain_ci"]
    print(f"{figures['questions']} questions: sampled answer = greedy answer {figures['agreement_before']:.3f} -> "
          f"{figures['agreement_after']:.3f}, {figures['gain']:+.3f} [{low:+.3f}, {high:+.3f}]")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
