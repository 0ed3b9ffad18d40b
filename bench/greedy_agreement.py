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


def _answer(trajectory) -> str | None:
    from cosearch_cli.metrics import normalize_answer

    return None if trajectory.answer is None else normalize_answer(trajectory.answer)


def agreement(sampled, greedy) -> dict[str, tuple[str, float]]:
    """Question id -> (dataset, share of its sampled trajectories whose answer is the greedy one)."""
    greedy_answer = {r.question_id: _answer(r.trajectories[0]) for r in greedy}
    out = {}
    for record in sampled:
        if record.question_id not in greedy_answer:
            raise SystemExit(f"question {record.question_id} has no greedy rollout: pass the same questions' runs")
        target = greedy_answer[record.question_id]
        same = [_answer(t) == target for t in record.trajectories]
        out[record.question_id] = (record.dataset, float(np.mean(same)))
    return out


def by_dataset(shares: dict[str, tuple[str, float]], ids: list[str]) -> dict[str, np.ndarray]:
    grouped = defaultdict(list)
    for qid in ids:
        dataset, value = shares[qid]
        grouped[dataset].append(value)
    return {d: np.asarray(v) for d, v in grouped.items()}


def compare(start: dict, end: dict, samples: int = 1000, seed: int = 0) -> dict:
    """Mean agreement (over datasets) at the start and at the end, and end - start with its paired CI."""
    from cosearch_cli.evaluate import paired_bootstrap

    if set(start) != set(end):
        raise SystemExit("start and end hold different questions: pass the same questions' runs")
    ids = sorted(start)
    before, after = by_dataset(start, ids), by_dataset(end, ids)
    stats = paired_bootstrap({d: after[d] - before[d] for d in before}, samples=samples, seed=seed)["average"]
    return {"questions": len(ids), "agreement_before": float(np.mean([v.mean() for v in before.values()])),
            "agreement_after": float(np.mean([v.mean() for v in after.values()])), "gain": stats["diff"],
            "gain_ci": [stats["ci_low"], stats["ci_high"]],
            "bootstrap": {"samples": samples, "seed": seed, "resampling": "questions within each dataset, paired"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", required=True, help="SAMPLED,GREEDY rollouts of the model before training")
    parser.add_argument("--end", required=True, help="SAMPLED,GREEDY rollouts of the trained model")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    from cosearch_cli.train import read_records

    sides = {}
    for name, item in (("start", args.start), ("end", args.end)):
        paths = item.split(",")
        if len(paths) != 2:
            raise SystemExit(f"--{name} {item!r}: write SAMPLED.jsonl,GREEDY.jsonl")
        sides[name] = agreement(*(read_records(Path(p)) for p in paths))
    figures = {"command": "python bench/greedy_agreement.py " + " ".join(sys.argv[1:]),
               **compare(sides["start"], sides["end"])}
    low, high = figures["gain_ci"]
    print(f"{figures['questions']} questions: sampled answer = greedy answer {figures['agreement_before']:.3f} -> "
          f"{figures['agreement_after']:.3f}, {figures['gain']:+.3f} [{low:+.3f}, {high:+.3f}]")
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
