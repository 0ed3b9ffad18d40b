"""One GRPO update of SmolLM2-135M (fp32, CPU) on the same batch: cosearch's path vs TRL's GRPO loss path.

Each run happens in a fresh subprocess (so peak RSS belongs to that run alone), alternating the two paths,
so both see the same machine load. The batch mimics agent trajectories: a prompt, generated turns and
inserted passages (mask 0), with lengths spread so padding matters. TRL gets the same token ids, mask (as its
`tool_mask`), sampling log-probs, advantages and reference log-probs, in its own batching (prompt left-padded,
completion right-padded, `per_device_train_batch_size` rows per micro-batch, in the given order), and its
loss type "dapo", which is token-mean over the whole batch like ours. Both use the same torch AdamW and
gradient clipping, so the timed difference is the loss path (forward, log-probs, loss, backward).

    nice -n 10 .venv/bin/python bench/bench_update.py --repeats 2 --out bench/results/update_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cosearch_cli.records import GroupInfo, RolloutRecord, Trajectory  # noqa: E402


def make_batch(n_questions: int, group: int, seed: int, vocab: int) -> list[RolloutRecord]:
    """Trajectories of 100-420 tokens: prompt, then generated turns (mask 1) and passages (mask 0)."""
    rng = random.Random(seed)
    records = []
    for q in range(n_questions):
        trajs = []
        for s in range(group):
            length = rng.randrange(100, 420)
            prompt = rng.randrange(50, 90)
            mask = [0] * prompt
            generated = True
            while len(mask) < length:
                span = rng.randrange(20, 50) if generated else rng.randrange(40, 90)
                mask += [int(generated)] * span
                generated = not generated
            mask = mask[:length]
            ids = [rng.randrange(100, vocab) for _ in range(length)]
            trajs.append(Trajectory(sample=s, turns=[], answer=None, n_searches=0, format_ok=True, token_ids=ids,
                                    loss_mask=mask, logprobs=[0.0] * length, prompt_len=prompt,
                                    advantage=round(rng.uniform(-1.5, 1.5), 3)))
        records.append(RolloutRecord(question_id=f"q{q}", question="?", answers=["a"], dataset="bench",
                                     trajectories=trajs, stage="scored", sampling={"temperature": 1.0},
                                     groups=[GroupInfo(f"q{q}/agent", "agent", [str(t.sample) for t in trajs],
                                                       True)]))
    return records


def fill_logprobs(records, model) -> None:
    """Sampling log-probs = the model's own, perturbed, so the ratio is near 1 and some tokens clip."""
    rng = random.Random(1)
    with torch.no_grad():
        for record in records:
            for traj in record.trajectories:
                logp = torch.log_softmax(model(torch.tensor([traj.token_ids])).logits[0].float(), -1)
                traj.logprobs = [float(logp[t - 1, traj.token_ids[t]]) + rng.uniform(-0.3, 0.3) if m else 0.0
                                 for t, m in enumerate(traj.loss_mask)]


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


# ---------------------------------------------------------------------------------------------------------
# The two paths; each returns (metrics dict) and is timed from models-in-memory to weights-updated.


def run_ours(records, model, ref, args) -> dict:
    from cosearch_cli.update import UpdateConfig, run_update

    config = UpdateConfig(kl_coef=args.kl_coef, token_budget=args.token_budget, lr=1e-6)
    cpu = time.process_time()
    result = run_update(records, role="agent", model=model, ref_model=ref, config=config)
    m = result.metrics
    return {"seconds": m["seconds"], "cpu_seconds": time.process_time() - cpu, "loss": m["loss"], "grad_norm": m["grad_norm"], "real_tokens": m["real_tokens"],
            "padded_tokens": m["padded_tokens"], "trained_tokens": m["tokens"], "micro_batches": m["micro_batches"]}


def run_trl(records, model, ref, args, model_dir: str) -> dict:
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    seqs = [t for r in records for t in r.trajectories]
    rows = args.trl_rows
    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(output_dir=tmp, use_cpu=True, bf16=False, beta=args.kl_coef, loss_type="dapo",
                            per_device_train_batch_size=rows, num_generations=rows,
                            gradient_accumulation_steps=-(-len(seqs) // rows), epsilon=0.2, learning_rate=1e-6,
                            report_to=[], logging_steps=1)
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=config, train_dataset=Dataset.from_list([{"prompt": "x"}] * rows))
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
    pad = trainer.processing_class.pad_token_id
    model = trainer.model
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6,
                                  weight_decay=0.01)
    batches = [seqs[i:i + rows] for i in range(0, len(seqs), rows)]
    num_items = torch.tensor(float(sum(sum(t.loss_mask) for t in seqs)))
    started, cpu = time.perf_counter(), time.process_time()
    loss_total, real, padded = 0.0, 0, 0
    for chunk in batches:
        inputs = trl_inputs(chunk, pad)
        inputs["num_items_in_batch"] = num_items
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        if args.kl_coef > 0:
            with torch.no_grad():
                inputs["ref_per_token_logps"], _, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.ref_model, ids, att, inputs["completion_ids"].size(1))
        loss = trainer.compute_loss(model, inputs)
        loss.backward()
        loss_total += loss.item()
        real += int(att.sum())
        padded += att.numel()
    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
    optimizer.step()
    optimizer.zero_grad()
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "cpu_seconds": time.process_time() - cpu, "loss": loss_total, "grad_norm": grad_norm, "real_tokens": real,
            "padded_tokens": padded, "trained_tokens": int(num_items), "micro_batches": len(batches)}


def trl_inputs(chunk, pad: int) -> dict:
    """TRL's layout: prompt (tokens before the first generated one) left-padded, the rest right-padded."""
    starts = [t.loss_mask.index(1) for t in chunk]
    p_len = max(starts)
    c_len = max(len(t.token_ids) - s for t, s in zip(chunk, starts))
    b = len(chunk)
    prompt_ids = torch.full((b, p_len), pad)
    prompt_mask = torch.zeros((b, p_len), dtype=torch.long)
    completion_ids = torch.full((b, c_len), pad)
    completion_mask = torch.zeros((b, c_len), dtype=torch.long)
    tool_mask = torch.zeros((b, c_len), dtype=torch.long)
    old = torch.zeros((b, c_len))
    for i, (t, s) in enumerate(zip(chunk, starts)):
        prompt_ids[i, p_len - s:] = torch.tensor(t.token_ids[:s])
        prompt_mask[i, p_len - s:] = 1
        n = len(t.token_ids) - s
        completion_ids[i, :n] = torch.tensor(t.token_ids[s:])
        completion_mask[i, :n] = 1
        tool_mask[i, :n] = torch.tensor(t.loss_mask[s:])
        old[i, :n] = torch.tensor(t.logprobs[s:])
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "tool_mask": tool_mask, "old_per_token_logps": old,
            "advantages": torch.tensor([t.advantage for t in chunk])}


# ---------------------------------------------------------------------------------------------------------


def child(args) -> None:
    import pickle

    from cosearch_cli.models import load_causal_lm, resolve_lm

    records = pickle.loads(Path(args.batch).read_bytes())
    model, _ = load_causal_lm("smollm2")
    ref = None
    if args.kl_coef > 0 and args.path == "ours":
        ref, _ = load_causal_lm("smollm2")
    if args.path == "ours":
        out = run_ours(records, model, ref, args)
    else:
        out = run_trl(records, model, ref, args, str(resolve_lm("smollm2")))
    out["peak_rss_gb"] = peak_rss_gb()
    print("RESULT " + json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--kl-coef", type=float, default=0.001)
    parser.add_argument("--token-budget", type=int, default=2048)
    parser.add_argument("--trl-rows", type=int, default=4, help="TRL per_device_train_batch_size")
    parser.add_argument("--out", default=None, help="Markdown file for the results")
    parser.add_argument("--path", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--batch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.path:
        child(args)
        return

    import pickle

    from cosearch_cli.models import load_causal_lm

    model, tokenizer = load_causal_lm("smollm2")
    records = make_batch(args.questions, args.group, seed=0, vocab=len(tokenizer))
    fill_logprobs(records, model)
    del model
    batch = Path(tempfile.mkdtemp()) / "batch.pkl"
    batch.write_bytes(pickle.dumps(records))
    runs: dict[str, list[dict]] = {"ours": [], "trl": []}
    for rep in range(args.repeats):
        for path in (("ours", "trl") if rep % 2 == 0 else ("trl", "ours")):  # alternate who goes first
            cmd = [sys.executable, __file__, "--path", path, "--batch", str(batch), "--kl-coef", str(args.kl_coef),
                   "--token-budget", str(args.token_budget), "--trl-rows", str(args.trl_rows)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not lines:
                sys.exit(f"{path} failed:\n{proc.stderr[-4000:]}")
            result = json.loads(lines[-1][7:])
            runs[path].append(result)
            print(f"rep {rep} {path}: {json.dumps(result)}", file=sys.stderr, flush=True)
    report = render(runs, args)
    print(report)
    if args.out:
        Path(args.out).write_text(report)


def render(runs: dict, args) -> str:
    def median(values):
        values = sorted(values)
        return values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1:][:2]) / 2

    lines = [
        "# `cosearch update` vs TRL GRPO loss path: one update, SmolLM2-135M, fp32, CPU",
        "",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Machine: {platform.machine()}, "
        f"{os.cpu_count()} cores, 24 GiB, no GPU, shared with other jobs (noisy). torch {torch.__version__}.",
        "",
        f"Command: `nice -n 10 .venv/bin/python bench/bench_update.py --questions {args.questions} --group "
        f"{args.group} --repeats {args.repeats} --kl-coef {args.kl_coef} --token-budget {args.token_budget} "
        f"--trl-rows {args.trl_rows}" + (f" --out {args.out}`" if args.out else "`"),
        "",
        f"Batch: {args.questions} questions x {args.group} trajectories, 100-420 tokens each (prompt, generated "
        "turns, inserted passages with mask 0). Runs alternate ours/TRL in fresh processes; medians over "
        f"{args.repeats} repeats (who goes first alternates). Seconds = models in memory -> weights updated "
        "(reference forward included when kl-coef > 0); CPU seconds = process CPU time of that section (less "
        "sensitive to other jobs than wall time). tokens/s = real (unpadded) sequence tokens / wall seconds.",
        "",
        "| path | seconds (wall) | tokens/s (wall) | CPU seconds | trained tokens | padding share | micro-batches "
        "| peak RSS GB | loss | grad norm |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path, label in (("ours", "cosearch update"), ("trl", "TRL 1.16 GRPO (dapo loss)")):
        rs = runs[path]
        sec = median([r["seconds"] for r in rs])
        r0 = rs[0]
        cpu = median([r["cpu_seconds"] for r in rs])
        lines.append(f"| {label} | {sec:.1f} | {r0['real_tokens'] / sec:.1f} | {cpu:.1f} | {r0['trained_tokens']} | "
                     f"{1 - r0['real_tokens'] / r0['padded_tokens']:.1%} | {r0['micro_batches']} | "
                     f"{max(r['peak_rss_gb'] for r in rs):.1f} | {r0['loss']:.6f} | {r0['grad_norm']:.4f} |")
    lines += ["", "All runs (wall / CPU seconds): " + "; ".join(
        f"{p}: " + ", ".join(f"{r['seconds']:.1f}/{r['cpu_seconds']:.1f}" for r in runs[p]) for p in runs), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
