"""Rollout speed: batched `run_rollouts` against a naive loop with batch-1 `model.generate`.

Both modes run the same questions, model, settings and rollout code; they differ only in how generation is
batched:
  batched  run_rollouts as `cosearch rollout` runs it: every live trajectory of every question in flight
           generates together (transformers backend, KV cache, rows leave the batch when they stop), all
           ranker calls of a turn form one batch, all sub-queries one retrieval batch.
  naive    one question in flight, and every sequence (agent turn or ranker call) is its own
           `model.generate` call with batch size 1: one trajectory at a time.
Each mode runs in its own process (so peak RSS is its own), both at the same time so that a shared, noisy
machine slows them alike; tokens per CPU second are reported beside tokens per wall second.

    .venv/bin/python bench/bench_rollout.py --questions 4 --n 4            # both modes, Markdown to stdout

After the table it prints where the batched run's model time went (prompt tokens encoded, decode steps and
their mean batch) and a ceiling: the same prompt tokens at the model's best prefill rate plus the same
generated tokens at the per-token cost of a full batch-64 decode step, i.e. the speed no scheduling of this
work could beat on this machine with exact fp32 compute.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Batch1Generate:
    """A GenerationBackend that calls Hugging Face `model.generate` once per sequence (the naive baseline)."""

    name = "hf-batch1"

    def __init__(self, model, tokenizer):
        self.model, self._tokenizer = model, tokenizer

    @property
    def tokenizer(self):
        return self._tokenizer

    def generate(self, requests, settings):
        return [self._one(r, settings) for r in requests]

    def _one(self, request, settings):
        import torch
        from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

        from cosearch_cli.generation.base import Generation

        prompt_len = len(request.prompt_ids)
        constraint = request.constraint

        def mask_logits(input_ids, scores):
            if constraint is not None:
                mask = constraint.allowed(input_ids[0, prompt_len:].tolist())
                if mask is not None:
                    allowed = torch.zeros(scores.shape[-1], dtype=torch.bool)
                    allowed[:len(mask)] = torch.as_tensor(mask)[:scores.shape[-1]]
                    scores = scores.masked_fill(~allowed, float("-inf"))
            return scores

        class Complete(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                done = constraint is not None and constraint.is_complete(input_ids[0, prompt_len:].tolist())
                return torch.tensor([done])

        torch.manual_seed(request.seed or settings.seed)
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([request.prompt_ids]), attention_mask=torch.ones(1, prompt_len, dtype=torch.long),
                max_new_tokens=settings.max_new_tokens, do_sample=not settings.greedy,
                temperature=settings.temperature if not settings.greedy else None,
                top_p=settings.top_p if not settings.greedy else None, top_k=None,
                stop_strings=list(settings.stop) or None, tokenizer=self._tokenizer,
                logits_processor=LogitsProcessorList([mask_logits]),
                stopping_criteria=StoppingCriteriaList([Complete()]),
                output_logits=True, return_dict_in_generate=True, pad_token_id=self._tokenizer.pad_token_id)
        ids = out.sequences[0, prompt_len:].tolist()
        temperature = 1.0 if settings.greedy else settings.temperature
        logprobs = [torch.log_softmax(step[0] / temperature, -1)[t].item() for step, t in zip(out.logits, ids)]
        return Generation(ids, self._tokenizer.decode(ids, skip_special_tokens=False), logprobs)


def run_mode_index(folder: str) -> None:
    from cosearch_cli.index import build_index
    from cosearch_cli.index.corpus import Corpus

    build_index(Corpus(str(ROOT / "fixtures" / "corpus.jsonl")), folder, bm25=True)


def model_rates(backend, context: int = 400, batch: int = 64, steps: int = 8) -> dict:
    """The backend model's best rates on this machine: prefill tokens/s (4 x 512 tokens, no padding) and seconds
    per one-token decode step at batch 1 and at `batch` rows with `context` tokens of context each."""
    import torch

    from cosearch_cli.generation.kvcache import new_cache, row_kv, seeded_cache

    model, kw = backend.model, backend._cache_kw  # the cache keyword this transformers release takes
    torch.manual_seed(0)
    ids = torch.randint(100, 40_000, (4, 512))
    with torch.inference_mode():
        model(input_ids=ids[:1, :64], logits_to_keep=1)  # warm-up
        started = time.perf_counter()
        model(input_ids=ids, logits_to_keep=1, use_cache=True, **{kw: new_cache(model)})
        prefill = ids.numel() / (time.perf_counter() - started)
        cache = new_cache(model)
        model(input_ids=ids[:1, :context], use_cache=True, logits_to_keep=1, **{kw: cache})
        kv = row_kv(cache, 0, torch.ones(context, dtype=torch.bool))
        step = {}
        for rows in (1, batch):
            cache = seeded_cache(model, [kv] * rows, [context] * rows, context)
            token = torch.full((rows, 1), 1000)
            started = time.perf_counter()
            for i in range(steps):
                model(input_ids=token, attention_mask=torch.ones(rows, context + i + 1, dtype=torch.long),
                      position_ids=torch.full((rows, 1), context + i), use_cache=True, **{kw: cache})
            step[rows] = (time.perf_counter() - started) / steps
    return {"prefill_tokens_per_s": prefill, "step_s_batch1": step[1], "step_s_batch": step[batch],
            "rate_batch": batch, "rate_context": context}


def run_mode(mode: str, args) -> dict:
    from dataclasses import asdict, replace

    from cosearch_cli.generation.hf import HFBackend
    from cosearch_cli.index import open_index
    from cosearch_cli.models import load_causal_lm
    from cosearch_cli.records import read_question
    from cosearch_cli.rollout import RolloutConfig, RolloutStats, constraint_factories, run_rollouts

    index = open_index(args.index)
    count = args.questions if mode == "batched" else (args.naive_questions or args.questions)
    lines = (ROOT / "fixtures" / "dev.jsonl").read_text().splitlines()[:count]
    questions = [read_question(json.loads(line), "dev.jsonl", i) for i, line in enumerate(lines, 1)]
    model, tokenizer = load_causal_lm("smollm2")
    cache_bytes = 0 if args.no_prefix_reuse else 2 * 2**30
    backend = (HFBackend(model, tokenizer, cache_bytes=cache_bytes) if mode == "batched"
               else Batch1Generate(model, tokenizer))
    config = RolloutConfig(n=args.n, max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, seed=args.seed,
                           question_chunk=args.questions if mode == "batched" else 1, retriever="bm25")
    agent_c, ranker_c = constraint_factories(args.constrain, "smollm2", HFBackend(model, tokenizer),
                                             HFBackend(model, tokenizer))
    config = replace(config, agent_constraint=agent_c, ranker_constraint=ranker_c)
    stats = RolloutStats()
    cpu_before = _cpu_seconds()
    started = time.perf_counter()
    records = list(run_rollouts(questions, agent=backend, ranker_backend=backend, index=index, config=config,
                                stats=stats))
    wall = time.perf_counter() - started
    cpu = _cpu_seconds() - cpu_before
    trajs = [t for r in records for t in r.trajectories]
    calls = [c for r in records for c in r.ranker_calls]
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # before model_rates' own batch
    engine = {**asdict(backend.counters), **model_rates(backend)} if mode == "batched" else {}
    return {**engine, "peak_rss_gib": peak_rss, "mode": mode, "questions": count, "wall_s": wall, "cpu_s": cpu,
            "agent_s": stats.agent_seconds, "ranker_s": stats.ranker_seconds, "retrieval_s": stats.retrieval_seconds,
            "agent_tokens": stats.agent_tokens, "ranker_tokens": stats.ranker_tokens, "trajectories": len(trajs),
            "ranker_calls": len(calls), "format_ok": sum(t.format_ok for t in trajs),
            "ranker_valid": sum(c.valid for c in calls), "searches": sum(t.n_searches for t in trajs)}


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _tokens(r: dict) -> int:
    return r["agent_tokens"] + r["ranker_tokens"]


def table(rows: list[dict]) -> str:
    head = ["mode", "questions", "wall s", "CPU s", "generated tokens (agent + ranker)", "tokens/s (wall)",
            "tokens/CPU-s", "agent s", "ranker s", "retrieval s", "other s", "peak RSS GiB", "searches",
            "ranker calls (valid)", "format ok"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        other = r["wall_s"] - r["agent_s"] - r["ranker_s"] - r["retrieval_s"]
        cells = [r["mode"], r["questions"], f"{r['wall_s']:.1f}", f"{r['cpu_s']:.1f}",
                 f"{_tokens(r)} ({r['agent_tokens']} + {r['ranker_tokens']})", f"{_tokens(r) / r['wall_s']:.1f}",
                 f"{_tokens(r) / r['cpu_s']:.1f}", f"{r['agent_s']:.1f}", f"{r['ranker_s']:.1f}",
                 f"{r['retrieval_s']:.2f}", f"{other:.1f}", f"{r['peak_rss_gib']:.2f}", r["searches"],
                 f"{r['ranker_calls']} ({r['ranker_valid']})", f"{r['format_ok']}/{r['trajectories']}"]
        out.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=4, help="first Q questions of fixtures/dev.jsonl")
    parser.add_argument("--naive-questions", type=int, default=None,
                        help="run the naive loop on only the first of those questions (its tokens/s does not "
                             "depend on how many it runs; batch-1 is slow on a shared machine)")
    parser.add_argument("--n", type=int, default=4, help="G trajectories per question")
    parser.add_argument("--max-turns", type=int, default=2)  # the cpu preset's T, N, K and token budget
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--constrain", default="agent,ranker", help="roles with constrained decoding")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-prefix-reuse", action="store_true",
                        help="batched mode encodes every prompt in full (the backend before prefix reuse)")
    parser.add_argument("--index", default="/tmp/cosearch-bench-index", help="BM25 fixture index (built if missing)")
    parser.add_argument("--mode", choices=["batched", "naive"], help="run one mode and print JSON (internal)")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args)))
        return
    # Both modes run at the same time, so a shared, noisy machine slows them alike; CPU seconds are reported
    # too because they depend less on what else runs.
    if not Path(args.index).is_dir():
        run_mode_index(args.index)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    procs = {mode: subprocess.Popen([sys.executable, __file__, "--mode", mode, *sys.argv[1:]], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for mode in ("batched", "naive")}
    rows = []
    for mode, proc in procs.items():
        out, err = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"{mode} failed:\n{err[-3000:]}")
        rows.append(json.loads(out.strip().splitlines()[-1]))
    batched, naive = rows
    print(table(rows))
    wall = (_tokens(batched) / batched["wall_s"]) / (_tokens(naive) / naive["wall_s"])
    cpu = (_tokens(batched) / batched["cpu_s"]) / (_tokens(naive) / naive["cpu_s"])
    print(f"\nspeed-up, batched / naive: {wall:.1f}x in generated tokens per wall second, {cpu:.1f}x per CPU second")
    print(ceiling(batched, naive))


def ceiling(batched: dict, naive: dict) -> str:
    """How fast the batched run could be at best: its prompt tokens at the model's best prefill rate plus its
    generated tokens at the best per-token cost of a full batch-`rate_batch` decode step (no step wasted on
    stragglers, no padding, nothing else)."""
    b = batched
    prefill_s = b["encoded_tokens"] / b["prefill_tokens_per_s"]
    decode_s = _tokens(b) * b["step_s_batch"] / b["rate_batch"]
    best = _tokens(b) / (prefill_s + decode_s)
    naive_rate = _tokens(naive) / naive["wall_s"]
    run_decode = b["decode_rows"] / b["decode_seconds"] if b["decode_seconds"] else 0.0
    return "\n".join([
        "",
        f"batched engine: {b['encoded_tokens']} prompt tokens encoded in {b['encode_seconds']:.1f} s "
        f"({b['encoded_tokens'] / max(b['encode_seconds'], 1e-9):.0f} tokens/s); {b['decode_steps']} decode steps "
        f"computing {b['decode_rows']} tokens in {b['decode_seconds']:.1f} s (mean batch "
        f"{b['decode_rows'] / max(b['decode_steps'], 1):.1f}, {run_decode:.0f} tokens/s)",
        f"model rates: prefill {b['prefill_tokens_per_s']:.0f} tokens/s (4 x 512, no padding); one decode step "
        f"{b['step_s_batch1'] * 1000:.0f} ms at batch 1, {b['step_s_batch'] * 1000:.0f} ms at batch "
        f"{b['rate_batch']} ({b['rate_context']} tokens of context)",
        f"ceiling: the same prompt tokens at that prefill rate ({prefill_s:.1f} s) + the same generated tokens at "
        f"full-batch-{b['rate_batch']} decode cost ({decode_s:.1f} s) = {best:.1f} tokens/s, "
        f"{best / naive_rate:.1f}x the naive loop; measured {_tokens(b) / b['wall_s']:.1f} tokens/s "
        f"= {(_tokens(b) / b['wall_s']) / best:.0%} of that ceiling",
    ])


if __name__ == "__main__":
    main()
