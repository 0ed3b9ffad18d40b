"""The GPU path checked on one GPU with a tiny random Llama built here (no downloads): run by scripts/gpu_check.sh.

Checks, each printed as PASS or FAIL with its numbers:
  rollout    the hf backend samples on cuda; its recorded log-probs against the fp32 trainer's on the same
             tokens (the engine/trainer gap), for an fp32 and a bf16 engine
  update     one GRPO step in bf16 mixed precision against the fp32 step on the same batch (loss within 0.2%)
  recompute  old log-probs recomputed by the trainer: first ratio exactly 1, the gap logged
  fsdp       FSDP full-shard on a process group of one (NCCL), bf16, with and without CPU offload, against the
             plain update
Needs torch (CUDA build), transformers and orjson; nothing else of cosearch's dependencies.
COSEARCH_GPU_CHECK_DEVICE=cpu rehearses the same checks on a CPU (not a GPU result).
"""

from __future__ import annotations

import copy
import math
import os
import random
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

DEVICE = os.environ.get("COSEARCH_GPU_CHECK_DEVICE", "cuda")
VOCAB = 512
RESULTS: list[tuple[str, bool, str]] = []


def check(name: str):
    def run(fn):
        started = time.perf_counter()
        try:
            ok, detail = fn()
        except Exception as exc:  # a check that crashes is a FAIL with its reason, and the others still run
            ok, detail = False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        RESULTS.append((name, ok, detail))
        print(f"[{'PASS' if ok else 'FAIL'}] {name} ({time.perf_counter() - started:.1f} s): {detail}", flush=True)
        return fn
    return run


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).eval()


def tiny_tokenizer():
    """A word-level tokenizer over t0..t511 (no files, no downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, VOCAB)}}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", bos_token="<s>", eos_token="</s>")


def trainer_logprobs(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + output], device=next(model.parameters()).device)
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(output, device=ids.device)[:, None]).squeeze(-1)


def engine_gap(engine_model, trainer_model, tokenizer) -> tuple[float, float, int]:
    from cosearch_cli.generation.base import GenerationRequest, SamplingSettings
    from cosearch_cli.generation.hf import HFBackend

    backend = HFBackend(engine_model, tokenizer)
    rng = random.Random(0)
    requests = [GenerationRequest([1] + [rng.randrange(3, VOCAB) for _ in range(20 + i)], seed=i) for i in range(16)]
    gens = backend.generate(requests, SamplingSettings(max_new_tokens=48, temperature=1.0, seed=0))
    diffs = []
    for request, gen in zip(requests, gens):
        assert gen.token_ids and all(math.isfinite(x) for x in gen.logprobs), "empty output or non-finite log-prob"
        trainer = trainer_logprobs(trainer_model, request.prompt_ids, gen.token_ids)
        diffs.append(trainer.cpu().double() - torch.tensor(gen.logprobs, dtype=torch.float64))
    d = torch.cat(diffs)
    return float(d.abs().mean()), float((torch.expm1(d) - d).mean()), len(d)


def scored_records(model, n_questions: int = 4, noise: float = 0.2):
    """Scored records whose recorded log-probs are the model's own plus noise (some ratios clip)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_update_support import scored_record

    rng = random.Random(1)
    records = []
    for q in range(n_questions):
        record = scored_record(f"q{q}", seed=q, vocab=VOCAB, lengths=(120, 90, 150, 60), ranker=False)
        with torch.no_grad():
            for traj in record.trajectories:
                ids = torch.tensor([traj.token_ids], device=next(model.parameters()).device)
                logp = torch.log_softmax(model(ids).logits[0].float(), -1)
                traj.logprobs = [float(logp[t - 1, traj.token_ids[t]]) + rng.uniform(-noise, noise) if m else 0.0
                                 for t, m in enumerate(traj.loss_mask)]
        records.append(record)
    return records


def update(model, records, **options) -> dict:
    from cosearch_cli.update import UpdateConfig, run_update

    model = copy.deepcopy(model)
    config = UpdateConfig(lr=1e-4, kl_coef=0.0, diagnostics=False, **options)
    return run_update(copy.deepcopy(records), role="agent", model=model, config=config).metrics


def main() -> int:
    print(f"torch {torch.__version__}, device {DEVICE}"
          + (f" ({torch.cuda.get_device_name(0)}, bf16 {torch.cuda.is_bf16_supported()})"
             if DEVICE == "cuda" and torch.cuda.is_available() else ""), flush=True)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("[FAIL] cuda: torch sees no GPU")
        return 1
    tokenizer = tiny_tokenizer()
    model = tiny_llama().to(DEVICE)

    @check("rollout")
    def _():
        fp32_abs, fp32_kl, n = engine_gap(model, model, tokenizer)
        bf16_abs, bf16_kl, _ = engine_gap(copy.deepcopy(model).to(torch.bfloat16), model, tokenizer)
        ok = fp32_abs < 2e-3 and bf16_abs < 0.2
        return ok, (f"{n} sampled tokens; fp32 engine vs fp32 trainer: mean |d| {fp32_abs:.2e}, KL {fp32_kl:.2e}; "
                    f"bf16 engine: mean |d| {bf16_abs:.2e}, KL {bf16_kl:.2e}")

    records = scored_records(model)

    @check("update-bf16")
    def _():
        fp32, bf16 = update(model, records), update(model, records, dtype="bfloat16")
        rel = abs(bf16["loss"] - fp32["loss"]) / abs(fp32["loss"])
        return rel < 2e-3, (f"loss fp32 {fp32['loss']:.6f} bf16 {bf16['loss']:.6f} (rel {rel:.2e}); grad norm "
                            f"{fp32['grad_norm']:.4f} / {bf16['grad_norm']:.4f}; {bf16['tokens_per_s']:.0f} tokens/s")

    @check("recompute-old-logprobs")
    def _():
        m = update(model, records, dtype="bfloat16", recompute_old=True, tis_cap=2.0)
        ok = abs(m["ratio"] - 1) < 1e-6 and 0 < m["logprob_gap_abs"] < 0.25
        return ok, (f"ratio {m['ratio']:.8f}; gap mean |d| {m['logprob_gap_abs']:.4f} (noise 0.2 + bf16), KL "
                    f"{m['logprob_gap_kl']:.2e}; TIS weight mean {m['tis_weight_mean']:.4f}")

    @check("fsdp-one-rank")
    def _():
        from cosearch_cli.update import distributed

        plain = update(model, records, dtype="bfloat16")
        distributed.init_local_group()
        try:
            sharded = update(model, records, dtype="bfloat16", parallel="fsdp")
            offloaded = update(model, records, dtype="bfloat16", parallel="fsdp", offload=True) \
                if DEVICE == "cuda" else sharded
        finally:
            torch.distributed.destroy_process_group()
        rel = max(abs(m["loss"] - plain["loss"]) / abs(plain["loss"]) for m in (sharded, offloaded))
        return rel < 5e-3, (f"loss plain {plain['loss']:.6f}, fsdp {sharded['loss']:.6f}, fsdp+offload "
                            f"{offloaded['loss']:.6f} (max rel {rel:.2e})")

    if DEVICE == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"SUMMARY: {'PASS' if not failed else 'FAIL'} ({len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else "") + f") on {DEVICE}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
