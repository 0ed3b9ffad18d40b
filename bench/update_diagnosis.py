"""Diagnose one GRPO update (issue 14): how far a single step moves the model, under each setting.

Takes one iteration's scored records and the model they were sampled from, and runs the same single update
from the same starting weights under several settings (learning rate, loss divisor), each in a fresh copy of
the model. Reports the update's diagnostics: KL(new || old) on the batch and, exactly over the vocabulary, on
held-out dev sequences (from an evaluation rollout never trained on), the gradient norm before clipping, the
share of the divisor's tokens that carry an advantage, and the largest and mean absolute weight change.

    python bench/update_diagnosis.py --scored runs/demo/iter-0000/scored.jsonl --model smollm2 \
        --heldout runs/demo/eval-init/rollouts.jsonl --lr 1e-5 3e-6 1e-6 --out bench/results/update_diagnosis.md
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

import orjson
import torch

from cosearch_cli.models import load_causal_lm
from cosearch_cli.train import read_records
from cosearch_cli.update import UpdateConfig, run_update
from cosearch_cli.update.batch import diagnostic_sequences


def weight_change(before: dict[str, torch.Tensor], model) -> tuple[float, float]:
    biggest, total, count = 0.0, 0.0, 0
    for name, p in model.named_parameters():
        d = (p.detach() - before[name]).abs()
        biggest = max(biggest, float(d.max()))
        total += float(d.sum())
        count += d.numel()
    return biggest, total / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scored", required=True, help="scored.jsonl of one iteration")
    parser.add_argument("--model", required=True, help="the model the records were sampled from")
    parser.add_argument("--heldout", required=True, help="an evaluation rollouts.jsonl (never trained on)")
    parser.add_argument("--heldout-limit", type=int, default=8)
    parser.add_argument("--role", default="agent", choices=("agent", "ranker"))
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-5, 3e-6, 1e-6])
    parser.add_argument("--norm-over", nargs="+", default=["trained", "batch"])
    parser.add_argument("--out", required=True, help="Markdown result; a .json twin is written beside it")
    args = parser.parse_args()

    records = read_records(Path(args.scored))
    heldout = diagnostic_sequences(read_records(Path(args.heldout)), "agent", args.heldout_limit)
    base, tokenizer = load_causal_lm(args.model)
    start = {n: p.detach().clone() for n, p in base.named_parameters()}
    load = os.getloadavg()
    rows = []
    for norm_over in args.norm_over:
        for lr in args.lr:
            model = copy.deepcopy(base)
            config = UpdateConfig(lr=lr, kl_coef=0.0, norm_over=norm_over, token_budget=1024)
            started = time.perf_counter()
            m = run_update(records, role=args.role, model=model, config=config, heldout=heldout,
                           pad_id=tokenizer.pad_token_id or 0).metrics
            biggest, mean = weight_change(start, model)
            rows.append({"norm_over": norm_over, "lr": lr, "kl_batch": m["kl_batch"], "kl_heldout": m["kl_heldout"],
                         "grad_norm": m["grad_norm"], "adv_token_share": m["adv_token_share"],
                         "norm_tokens": m["norm_tokens"], "trained_tokens": m["tokens"],
                         "sequences": m["sequences"], "entropy": m["entropy"],
                         "max_abs_change": biggest, "mean_abs_change": mean,
                         "seconds": round(time.perf_counter() - started, 1)})
            print(orjson.dumps(rows[-1]).decode(), flush=True)
            del model
    out = Path(args.out)
    meta = {"command": "python bench/update_diagnosis.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()),
        "machine": f"{os.cpu_count()} CPUs, load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}",
        "scored": args.scored, "model": args.model, "role": args.role, "heldout_sequences": len(heldout)}
    out.with_suffix(".json").write_bytes(orjson.dumps({**meta, "rows": rows}, option=orjson.OPT_INDENT_2))
    lines = [f"# One {args.role} update under each setting", "", f"`{meta['command']}`", "",
             f"Machine: {meta['machine']}. Held-out: {len(heldout)} dev sequences.", "",
             "| divisor | lr | KL batch | KL held-out | grad norm | tokens with advantage / divisor | "
             "max abs weight change | mean abs weight change |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['norm_over']} | {r['lr']:g} | {r['kl_batch']:.2e} | {r['kl_heldout']:.2e} | "
                     f"{r['grad_norm']:.3f} | {r['trained_tokens']}/{r['norm_tokens']} "
                     f"({r['adv_token_share']:.2f}) | {r['max_abs_change']:.2e} | {r['mean_abs_change']:.2e} |")
    out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
