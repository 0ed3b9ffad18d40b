"""The json twin of bench/results/ranker_warmup.md (issue 14, target b): the figures of `cosearch evaluate ranker`
for a warmed-up ranker, plus how many calls it ranked in another order than the retriever, and of those with an
answer-bearing candidate how many gained or lost Hit@1 (from the `--per-call` parquet's permutation columns).

    .venv/bin/python bench/ranker_warmup_summary.py --eval runs/study7-split/ranker-eval.json \
        --per-call runs/study7-split/ranker-calls.parquet --warmup runs/study7-split/warmup-ranker \
        --out bench/results/ranker_warmup.json
"""

from __future__ import annotations

import argparse
import re
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


def demonstrated_first_positions(outputs: list[str]) -> dict[str, int]:
    """How often each candidate position (1-based) is the first of the ranking a ranker demonstration writes,
    most frequent first (`outputs`: the demonstrations' generated text; the ranking follows RANKING_OPEN)."""
    from cosearch_cli.ranker import RANKING_OPEN

    firsts = []
    for text in outputs:
        found = re.search(re.escape(RANKING_OPEN) + r"\s*\[(\d+)\]", text)
        firsts.append(found.group(1) if found else "unparsed")
    counts = {position: firsts.count(position) for position in sorted(set(firsts))}
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def demonstration_outputs(folder: Path) -> list[str]:
    """The generated (unmasked) text of each ranker demonstration in a warm-up's demonstrations.jsonl."""
    from cosearch_cli.models import load_tokenizer

    tokenizer, out = load_tokenizer(str(folder)), []
    for line in (folder / "demonstrations.jsonl").read_bytes().splitlines():
        row = orjson.loads(line)
        if row["role"] == "ranker":
            out.append(tokenizer.decode([t for t, m in zip(row["token_ids"], row["mask"]) if m]))
    return out


def hit1_by_visibility(per_call: pl.DataFrame, visible: dict[str, bool]) -> dict:
    """Mean Hit@1 of each order over the scored calls (not dataset-averaged), apart for the calls whose
    candidates show an answer within the tokens the ranker reads (`visible[call_id]`) and the others."""
    scored = per_call.filter(pl.col("hit1").is_not_null())
    out = {}
    for label, wanted in (("answer_in_view", True), ("answer_out_of_view", False)):
        part = scored.filter(pl.col("call_id").is_in([c for c, v in visible.items() if v == wanted]))
        calls = part.filter(pl.col("order") == "retriever").height
        out[label] = {"calls": calls} | {order: round(float(part.filter(pl.col("order") == order)["hit1"].mean()), 3)
                                         for order in sorted(set(part["order"])) if calls}
    return out


def in_view_calls(calls_path: Path, index_folder: str, tokens: int | None) -> dict[str, bool]:
    """Per ranker call of a recorded run: whether some candidate shows a gold answer in its first `tokens`
    (None: the tokens the rollout's ranker read)."""
    from evidence_in_view import answer_in_view, recorded_calls

    from cosearch_cli.index import open_index
    from cosearch_cli.models import load_tokenizer

    tokenizer, docs = load_tokenizer("smollm2"), open_index(index_folder).docs
    return {call.id: any(answer_in_view(tokenizer, call.answers, call.texts, tokens or call.ranker_passage_tokens))
            for call in recorded_calls(calls_path, docs)}


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
    out["baseline_minus_retriever"] = {m: difference("baseline_vs_retriever", m) for m in ("hit1", "ndcg")}
    # tokens of each candidate the rankers read (None: an evaluation from before the option, the rollout's own)
    out["ranker_passage_tokens"] = evaluation.get("manifest", {}).get("options", {}).get("ranker_passage_tokens")
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
    ap.add_argument("--calls", type=Path, help="the rollouts the evaluation re-ranked: with --index, Hit@1 apart "
                                                "for the calls that show an answer within the ranker's tokens")
    ap.add_argument("--index", help="the index of those calls (passage texts)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    manifest = orjson.loads((args.warmup / "warmup.manifest.json").read_bytes()) if args.warmup else None
    per_call = pl.read_parquet(args.per_call)
    out = summary(orjson.loads(args.eval.read_bytes()), per_call, manifest)
    if args.warmup and (args.warmup / "demonstrations.jsonl").is_file():
        out["demonstrated_first_positions"] = demonstrated_first_positions(demonstration_outputs(args.warmup))
    if args.calls and args.index:
        tokens = out["ranker_passage_tokens"]
        out["hit1_by_visibility"] = {"tokens": tokens or "the rollout's"} | hit1_by_visibility(
            per_call, in_view_calls(args.calls, args.index, tokens))
    args.out.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
    print(orjson.dumps({k: out[k] for k in ("hit1", "warmup_minus_retriever",
                                            "calls_in_another_order_than_the_retriever", "hit1_higher",
                                            "hit1_lower")}).decode())


if __name__ == "__main__":
    main()
