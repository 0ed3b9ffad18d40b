"""Valid actions from the embedded model: free vs constrained decoding vs supervised warm-up (issue 8).

For each setting, G rollouts of every evaluation question with the LLM ranker in the loop, then:
valid agent turns, trajectories without a format failure, valid ranker outputs, answer F1, mean searches,
and the share of groups whose agent rewards (F1, or -0.2 on a format failure) are not all equal.

Evaluation questions: `--per-dataset` from each file of ../shared/data/dev, chosen by sha1 of the id.
Warm-up questions: the next ones in that order (never an evaluation question; checked).
Results are appended to --out (JSON) after every setting, so a partial run still reports.

    nice -n 10 .venv/bin/python bench/valid_actions.py --per-dataset 15 --n 4 --out /tmp/valid_actions.json
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import orjson  # noqa: E402
import torch  # noqa: E402

from cosearch_cli.generation.hf import HFBackend  # noqa: E402
from cosearch_cli.index import open_index  # noqa: E402
from cosearch_cli.index.build import build_index  # noqa: E402
from cosearch_cli.index.corpus import Corpus  # noqa: E402
from cosearch_cli.metrics import answer_scores  # noqa: E402
from cosearch_cli.models import load_causal_lm  # noqa: E402
from cosearch_cli.records import read_question  # noqa: E402
from cosearch_cli.rollout import RolloutStats, constraint_factories, preset, run_rollouts  # noqa: E402
from cosearch_cli.warmup import DemoStats, FinetuneConfig, build_demonstrations, check_no_overlap, finetune  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


class NeverEmpty:
    """An index whose retriever answers a query it finds nothing for (e.g. only stopwords) with the results
    of a fixed fallback query: the rollout stage cannot yet handle an empty hit list."""

    def __init__(self, index, fallback: str = "history of the world"):
        self.index, self.docs, self.manifest, self.fallback = index, index.docs, index.manifest, fallback

    def retriever(self, *args, **kwargs):
        inner = self.index.retriever(*args, **kwargs)
        fallback = self.fallback

        class _Retriever:
            def search(self, queries, k):
                hits = inner.search(queries, k)
                spare = inner.search([fallback], k)[0]
                return [h if h else spare for h in hits]

        return _Retriever()


def questions(per_dataset: int, skip: int = 0):
    out = []
    for path in sorted((DATA / "dev").glob("*.jsonl")):
        rows = [read_question(orjson.loads(line), str(path), i + 1)
                for i, line in enumerate(path.read_bytes().splitlines())]
        rows.sort(key=lambda q: hashlib.sha1(q.id.encode()).hexdigest())
        out += rows[skip:skip + per_dataset]
    return out


def summarise(records, seconds: float, stats: RolloutStats) -> dict:
    turns = [t for r in records for tr in r.trajectories for t in tr.turns]
    trajs = [tr for r in records for tr in r.trajectories]
    calls = [c for r in records for c in r.ranker_calls]
    spread = 0
    for r in records:
        rewards = [answer_scores(t.answer, r.answers)["f1"] if t.format_ok else -0.2 for t in r.trajectories]
        spread += len(set(rewards)) > 1
    return {
        "questions": len(records), "trajectories": len(trajs),
        "valid_agent_turns": sum(t.action != "invalid" for t in turns) / max(len(turns), 1),
        "format_ok_trajectories": sum(t.format_ok for t in trajs) / max(len(trajs), 1),
        "valid_ranker_outputs": sum(c.valid for c in calls) / max(len(calls), 1), "ranker_calls": len(calls),
        "answer_f1": sum(answer_scores(t.answer, r.answers)["f1"] for r in records for t in r.trajectories)
        / max(len(trajs), 1),
        "mean_searches": sum(t.n_searches for t in trajs) / max(len(trajs), 1),
        "groups_with_reward_spread": spread / max(len(records), 1),
        "seconds": round(seconds, 1),
        "tokens_per_s": round((stats.agent_tokens + stats.ranker_tokens) / max(seconds, 1e-9), 1),
        "example_turn": turns[0].text if turns else "",
    }


def run_setting(name, backend, model_name, constrain, evaluation, index, config, results, out):
    agent_c, ranker_c = constraint_factories(constrain, model_name, backend, backend)
    cfg = replace(config, agent_constraint=agent_c, ranker_constraint=ranker_c)
    stats = RolloutStats()
    started = time.perf_counter()
    records = []
    for record in run_rollouts(evaluation, agent=backend, ranker_backend=backend, index=index, config=cfg,
                               stats=stats):
        records.append(record)
        if len(records) % 8 == 0:  # a partial summary survives a run that is stopped early
            results["settings"][name] = {**summarise(records, time.perf_counter() - started, stats), "partial": True}
            Path(out).write_text(json.dumps(results, indent=2))
    results["settings"][name] = summarise(records, time.perf_counter() - started, stats)
    print(name, json.dumps(results["settings"][name]), file=sys.stderr, flush=True)
    Path(out).write_text(json.dumps(results, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-dataset", type=int, default=15, help="evaluation questions per dev file (7 files)")
    ap.add_argument("--warmup-per-dataset", type=int, default=10, help="warm-up training questions per file")
    ap.add_argument("--n", type=int, default=4, help="G: rollouts per question")
    ap.add_argument("--max-turns", type=int, default=1)
    ap.add_argument("--top-n", type=int, default=5)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--index", default="/tmp/cosearch-bench-shared-index")
    ap.add_argument("--settings", default="constrained,warmup+constrained,free,warmup",
                    help="settings to run, in this order (the warm-up trains once, on a copy, before the first)")
    ap.add_argument("--out", default="bench/results/valid_actions.json")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a crowded 2-core box)")
    ap.add_argument("--question-chunk", type=int, default=8, help="questions in flight (batch = n x this)")
    ap.add_argument("--save-warmup", default=None,
                    help="also save the warmed-up model here (a Hugging Face folder, e.g. to start `train` from)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    if not (Path(args.index) / "index.manifest.json").is_file():
        # relative to the working directory, so the index manifest names no machine's absolute folders
        build_index(Corpus([os.path.relpath(p) for p in sorted((DATA / "corpus").glob("*.jsonl"))]), args.index)
    index = NeverEmpty(open_index(args.index))
    evaluation = questions(args.per_dataset)
    train = questions(args.warmup_per_dataset, skip=args.per_dataset)
    check_no_overlap(train, evaluation)
    config = preset("cpu", n=args.n, max_turns=args.max_turns, top_n=args.top_n, k=args.k, seed=0,
                    question_chunk=args.question_chunk)
    results = {"args": vars(args), "evaluation_questions": len(evaluation), "settings": {},
               "machine": "2-core x86-64, 24 GiB, no GPU, shared/noisy", "torch_threads": torch.get_num_threads()}
    wanted = args.settings.split(",")

    model, tokenizer = load_causal_lm("smollm2")
    base = HFBackend(model, tokenizer)
    warm = None
    for name in wanted:  # in the order given, so the most wanted settings finish first
        if name.startswith("warmup") and warm is None:
            warm = HFBackend(warm_up(copy.deepcopy(model), tokenizer, train, index, config, args, results),
                             tokenizer)
        backend = warm if name.startswith("warmup") else base
        constrain = "agent,ranker" if name.endswith("constrained") else "none"
        run_setting(name, backend, "smollm2", constrain, evaluation, index, config, results, args.out)


def warm_up(model, tokenizer, train, index, config, args, results):
    stats = DemoStats()
    # all questions, supported or not: at this size the warm-up is mostly about the format
    demos = build_demonstrations(train, index=index, tokenizer=tokenizer, config=config, stats=stats,
                                 require_evidence=False)
    started = time.perf_counter()
    losses = finetune(model, demos, FinetuneConfig(epochs=args.epochs, lr=args.lr), pad_id=tokenizer.pad_token_id)
    results["warmup"] = {"demonstrations": vars(stats), "train_questions": len(train), "steps": len(losses),
                         "loss_first": losses[0], "loss_last": losses[-1],
                         "seconds": round(time.perf_counter() - started, 1)}
    print("warmup", json.dumps(results["warmup"]), file=sys.stderr, flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    if args.save_warmup:
        model.save_pretrained(args.save_warmup)
        tokenizer.save_pretrained(args.save_warmup)
        Path(args.save_warmup, "warmup.json").write_text(json.dumps(
            {**results["warmup"], "train_question_ids": [q.id for q in train], "args": vars(args)}, indent=2))
    return model


if __name__ == "__main__":
    main()
