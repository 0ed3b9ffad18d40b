"""Collect before/after comparisons made by `cosearch evaluate score START END` into one results JSON and a
Markdown table (issue 14, study 11's sampled and in-pool evaluations).

    .venv/bin/python bench/sampled_gains.py --pair "held-out, sampled=runs/s11-sampled/compare.json" \
        [--pair NAME=COMPARE.json ...] [--run NAME=EVALUATION.json ...] [--extra NAME=FILE ...] \
        --json bench/results/learning_study11_sampled.json

Per pair: the question count, how the rollouts were decoded (greedy, or the temperature and samples a
question), agent F1 and EM before and after with the paired bootstrap CI of the change (the comparison's own,
at its `--confidence`: questions resampled within each dataset, averaged over datasets; a question's score is
the mean over its samples), searches a question, the ranker's Hit@1 over its calls and the share of calls with
an answer-bearing candidate (each run's own calls, not paired), and per dataset and per hop the F1 change with
its CI and F1 and EM before and after. `--run NAME=EVALUATION.json` adds one run's figures (`evaluate score
RUN`: questions, decoding, F1, EM, per-dataset F1; not its manifest, which names the index's absolute folder).
`--extra NAME=FILE` embeds another JSON file (a manifest's counts, gain_by_visibility's subsets) under NAME.
No model is loaded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from learning_evidence import embed  # noqa: E402


def decoding(settings: list[dict]) -> str:
    """How a run's rollouts were decoded, from the rollout settings its evaluation recorded."""
    if len(settings) != 1:
        raise SystemExit(f"rollouts made with {len(settings)} different settings; compare one run with one")
    s = settings[0]
    return "greedy" if s["greedy"] else f"temperature {s['temperature']:g}, {s['n']} samples a question"


def pair_figures(comparison: dict) -> dict:
    """The figures of one `evaluate score A B` JSON (A before training, B after)."""
    if comparison.get("kind") != "comparison":
        raise SystemExit("not a comparison: pass the JSON of `cosearch evaluate score START END`")
    rows = {row["dataset"]: row for row in comparison["differences"]}
    average = rows["average"]
    groups = [{g["dataset"]: g for g in comparison[side]["groups"]}["average"] for side in ("a", "b")]
    before, after = (decoding(comparison[side]["variant"]["rollout_settings"]) for side in ("a", "b"))
    if before != after:
        raise SystemExit(f"the runs were decoded differently ({before}; {after}): no paired comparison")
    out = {"questions": average["questions"], "decoding": before}
    for metric in ("f1", "em"):
        out[f"agent_{metric}_before"], out[f"agent_{metric}_after"] = average[f"{metric}_a"], average[f"{metric}_b"]
        out[f"agent_{metric}_gain"] = average[f"{metric}_diff"]
        out[f"agent_{metric}_gain_ci"] = [average[f"{metric}_ci_low"], average[f"{metric}_ci_high"]]
    for key, name in (("searches", "searches"), ("hit@1", "ranker_hit1"),
                      ("answer_in_candidates", "answer_in_candidates")):
        out[f"{name}_before"], out[f"{name}_after"] = groups[0][key], groups[1][key]
    gains = {name: {"questions": row["questions"], "gain": row["f1_diff"],
                    "ci": [row["f1_ci_low"], row["f1_ci_high"]], "f1_before": row["f1_a"], "f1_after": row["f1_b"],
                    "em_before": row["em_a"], "em_after": row["em_b"]}
             for name, row in rows.items() if name != "average"}
    hops = ("single-hop", "multi-hop")
    out["per_dataset_f1_gain"] = {name: g for name, g in gains.items() if name not in hops}
    out["per_hop_f1_gain"] = {name: g for name, g in gains.items() if name in hops}
    out["bootstrap"] = comparison["bootstrap"]
    return out


def run_figures(evaluation: dict) -> dict:
    """The figures of one run's `evaluate score RUN` JSON: its question count, decoding, F1 and EM (averaged
    over datasets) and per-dataset F1; its manifest, which names the index's absolute folder, is left out."""
    if evaluation.get("kind") != "evaluation":
        raise SystemExit("not an evaluation: pass the JSON of `cosearch evaluate score RUN`")
    average = {g["dataset"]: g for g in evaluation["groups"]}["average"]
    return {"questions": average["questions"], "decoding": decoding(evaluation["variant"]["rollout_settings"]),
            "agent_f1": average["f1"], "agent_em": average["em"],
            "per_dataset_f1": {row["dataset"]: row["f1"] for row in evaluation["datasets"]}}


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def table(pairs: dict[str, dict]) -> str:
    """A Markdown table of the pairs' figures."""
    lines = ["| set | questions | decoding | agent F1 start -> end | change [CI] | EM change [CI] | CI | "
             "ranker Hit@1 over its calls, start -> end | searches start -> end |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, f in pairs.items():
        f1_low, f1_high = f["agent_f1_gain_ci"]
        em_low, em_high = f["agent_em_gain_ci"]
        lines.append(f"| {name} | {f['questions']} | {f['decoding']} | {f['agent_f1_before']:.3f} -> "
                     f"{f['agent_f1_after']:.3f} | {f['agent_f1_gain']:+.3f} [{f1_low:+.3f}, {f1_high:+.3f}] | "
                     f"{f['agent_em_gain']:+.3f} [{em_low:+.3f}, {em_high:+.3f}] | "
                     f"{100 * f['bootstrap']['confidence']:.3g}% | {_num(f['ranker_hit1_before'])}"
                     f" -> {_num(f['ranker_hit1_after'])} | {_num(f['searches_before'], '.2f')} -> "
                     f"{_num(f['searches_after'], '.2f')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", action="append", required=True,
                        help="NAME=COMPARE.json: the JSON of `cosearch evaluate score START END`")
    parser.add_argument("--run", action="append", default=[],
                        help="NAME=EVALUATION.json: one run's `cosearch evaluate score RUN` JSON, its figures")
    parser.add_argument("--extra", action="append", default=[], help="NAME=FILE: embed that JSON under NAME")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    pairs = {name: pair_figures(comparison) for name, comparison in embed({}, args.pair, "--pair").items()}
    print(table(pairs))
    if args.json:
        runs = {name: run_figures(evaluation) for name, evaluation in embed({}, args.run, "--run").items()}
        out = embed({"command": "python bench/sampled_gains.py " + " ".join(sys.argv[1:]), "pairs": pairs,
                     "runs": runs}, args.extra)
        Path(args.json).write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
