"""The json twin of bench/results/ranker_warmup.md (issue 14, target b): the figures of `cosearch evaluate ranker`
for a warmed-up ranker, plus how many calls it ranked in another order than the retriever, and of those with an
answer-bearing candidate how many gained or lost Hit@1 (from the `--per-call` parquet's permutation columns).

    .venv/bin/python bench/ranker_warmup_summary.py --eval runs/study7-split/ranker-eval.json \
        --per-call runs/study7-split/ranker-calls.parquet --warmup runs/study7-split/warmup-ranker \
        --out bench/results/ranker_warmup.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import polars as pl


def changed_calls(per_call: pl.DataFrame) -> dict:
    """Calls whose ranker order differs from the retriever's; of the scored ones, Hit@1 up and down."""
    def side(order: str, suffix: str) -> pl.DataFrame:
        return (per_call.filter(pl.col("order") == order).select("call_id", "permutation", "hit1")
                .rename({"permutation": f"perm_{suffix}", "hit1": f"hit1_{suffix}"}))

    both = side("ranker", "r").join(side("retriever", "t"), on="call_id")
    changed = both.filter(pl.col("perm_r") != pl.col("perm_t"))
    scored = changed.filter(pl.col("hit1_r").is_not_null())
    return {"calls_in_another_order_than_the_retriever": changed.height,
            "of_those_with_an_answer_bearing_candidate": scored.height,
            "hit1_higher": scored.filter(pl.col("hit1_r") > pl.col("hit1_t")).height,
            "hit1_lower": scored.filter(pl.col("hit1_r") < pl.col("hit1_t")).height}


def first_choices(per_call: pl.DataFrame, order: str = "ranker") -> dict[str, int]:
    """How often each candidate position (1-based, as the ranker writes it) came first in `order`'s rankings,
    most frequent first: a ranker that judges content spreads its first choices, one that learnt a position
    does not."""
    firsts = [p[0] + 1 for p in per_call.filter(pl.col("order") == order)["permutation"].to_list() if len(p)]
    counts = {str(position): firsts.count(position) for position in sorted(set(firsts))}
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def summary(evaluation: dict, per_call: pl.DataFrame, warmup_manifest: dict | None) -> dict:
    def figure(order: str, metric: str) -> float:
        return evaluation["orders"][order][metric]

    def difference(name: str, metric: str) -> dict:
        average = evaluation["differences"][name][metric]["average"]
        return {"diff": average["diff"], "ci": [average["ci_low"], average["ci_high"]]}

    out = {"calls": evaluation["calls"], "calls_with_answer": evaluation["calls_with_answer"], "k": evaluation["k"]}
    for metric in ("hit1", "ndcg"):
        out[metric] = {"warmup": figure("ranker", metric), "baseline": figure("baseline", metric),
                       "retriever": figure("retriever", metric)}
    out["invalid"] = {"warmup": figure("ranker", "invalid"), "baseline": figure("baseline", "invalid")}
    out["warmup_minus_retriever"] = {m: difference("ranker_vs_retriever", m) for m in ("hit1", "ndcg")}
    out["warmup_minus_baseline"] = {m: difference("ranker_vs_baseline", m) for m in ("hit1", "ndcg")}
    out |= changed_calls(per_call)
    out["first_choice_positions"] = {order: first_choices(per_call, order) for order in ("ranker", "baseline")}
    out["bootstrap"] = evaluation["bootstrap"]
    if warmup_manifest:
        out["warmup_options"] = {key: relative(value) for key, value in warmup_manifest["options"].items()}
        out["warmup_demonstrations"] = warmup_manifest.get("demonstrations")
        out["warmup_losses"] = warmup_manifest.get("losses")
    return out


def relative(value):
    """An absolute path inside the working folder as a relative one (committed files name no machine's paths)."""
    if isinstance(value, str) and Path(value).is_absolute() and Path(value).is_relative_to(Path.cwd()):
        return str(Path(value).relative_to(Path.cwd()))
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval", type=Path, required=True, help="the JSON `cosearch evaluate ranker -o` wrote")
    ap.add_argument("--per-call", type=Path, required=True, help="its --per-call parquet")
    ap.add_argument("--warmup", type=Path, help="the warmed-up checkpoint folder (its warmup.manifest.json)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    manifest = orjson.loads((args.warmup / "warmup.manifest.json").read_bytes()) if args.warmup else None
    out = summary(orjson.loads(args.eval.read_bytes()), pl.read_parquet(args.per_call), manifest)
    args.out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    print(orjson.dumps({k: out[k] for k in ("hit1", "warmup_minus_retriever",
                                            "calls_in_another_order_than_the_retriever", "hit1_higher",
                                            "hit1_lower")}).decode())


if __name__ == "__main__":
    main()
