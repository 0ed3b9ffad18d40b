"""The GPU path checked on one GPU with a tiny random Llama built here (no downloads): run by scripts/gpu_check.sh.

Checks, each printed as PASS or FAIL with its numbers:
  rollout    the hf backend samples on cuda; its recorded log-probs against the fp32 trainer's on the same
             tokens (the engine/trainer gap), for an fp32 and a bf16 engine
  update     one GRPO step in bf16 mixed precision against the fp32 step on the same batch (loss within 0.2%)
  recompute  old log-probs recomputed by the trainer: first ratio exactly 1, the gap logged
  fsdp       FSDP full-shard on a process group of one (NCCL), bf16, with and without CPU offload, against the
             plain update
  memory     two update steps of a randomly initialised model of a real shape (default Qwen2.5-3B-Instruct's)
             in bf16 and fp32, with and without gradient checkpointing and with a micro-batch twice as large:
             the measured peak GPU memory against memory_plan's estimate for the same update (the plan must
             not be below it; a case that runs out of memory passes only if the plan exceeds the GPU), and the
             update's tokens/s
  train      `cosearch train` end to end on cuda in bf16 (index, rollout, group, reward, update of agent and
             ranker, evaluation) with a tiny random Llama over the SmolLM2 tokenizer
Needs torch (CUDA build), transformers and orjson; `train` also needs polars, bm25s and PyStemmer and the SmolLM2
tokenizer (COSEARCH_GPU_CHECK_TOKENIZER: a folder with its tokenizer files), and is skipped without them.
COSEARCH_GPU_CHECK_DEVICE=cpu rehearses the same checks on a CPU (not a GPU result; `memory` then uses a small
shape and reports no peak). COSEARCH_GPU_CHECK_PLAN_MODEL names other known shapes for `memory` (comma-separated);
COSEARCH_GPU_CHECK_ONLY runs only the checks whose names start with one of its comma-separated prefixes.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # test_update_support: the tests' builders of models and records

import torch  # noqa: E402

DEVICE = os.environ.get("COSEARCH_GPU_CHECK_DEVICE", "cuda")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' loading bars, here and in subprocesses
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
VOCAB = 512
RESULTS: list[tuple[str, bool, str]] = []
SKIPPED: list[tuple[str, str]] = []


class Skip(Exception):
    """A check that cannot run here (a missing optional package or file): reported, not failed."""


ONLY = [name for name in os.environ.get("COSEARCH_GPU_CHECK_ONLY", "").split(",") if name]


def check(name: str):
    def run(fn):
        if ONLY and not any(name.startswith(prefix) for prefix in ONLY):
            SKIPPED.append((name, "not in COSEARCH_GPU_CHECK_ONLY"))
            return fn
        started = time.perf_counter()
        try:
            ok, detail = fn()
        except Skip as why:
            SKIPPED.append((name, str(why)))
            print(f"[SKIP] {name}: {why}", flush=True)
            return fn
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


def scored_record_of(vocab: int, q: int, length: int):
    """A scored record of 4 agent trajectories of `length` tokens each (log-probs random, advantages non-zero)."""
    from test_update_support import scored_record

    return scored_record(f"m{q}", seed=q, vocab=vocab, lengths=(length,) * 4, ranker=False)


def update(model, records, **options) -> dict:
    from cosearch_cli.update import UpdateConfig, run_update

    model = copy.deepcopy(model)
    config = UpdateConfig(lr=1e-4, kl_coef=0.0, diagnostics=False, **options)
    return run_update(copy.deepcopy(records), role="agent", model=model, config=config).metrics


def shaped_model(shape):
    """A randomly initialised decoder of `shape` (a memory_plan.ModelShape), built directly on DEVICE."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = (Qwen2Config, Qwen2ForCausalLM) if shape.qkv_bias else (LlamaConfig, LlamaForCausalLM)
    config = config_class(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
                          num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                          num_key_value_heads=shape.kv_heads, tie_word_embeddings=shape.tied,
                          max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device(DEVICE):
        return model_class(config).eval()


def measured_plan(shape, records, dtype: str, grad_checkpointing: bool, token_budget: int) -> int:
    """memory_plan's bytes for an update of `records` (as `cosearch update` plans it before loading)."""
    from cosearch_cli.memory_plan import UpdateSettings, batch_extent, plan_update
    from cosearch_cli.update.batch import training_sequences

    longest, trained = batch_extent(training_sequences(records, "agent"))
    settings = UpdateSettings(dtype=dtype, grad_checkpointing=grad_checkpointing, token_budget=token_budget)
    return plan_update(shape, settings, gpu_bytes=2**40, world=1, longest=longest, trained=trained).total


def measured_update(shape, records, dtype: str, grad_checkpointing: bool,
                    token_budget: int) -> tuple[int | None, dict]:
    """(peak GPU bytes of two update steps from an empty GPU, None on the CPU; the second step's metrics)."""
    import gc

    from cosearch_cli.update import UpdateConfig, run_update

    on_gpu = DEVICE == "cuda"
    if on_gpu:  # also frees what an earlier case that ran out of memory left
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    model = shaped_model(shape)
    assert sum(p.numel() for p in model.parameters()) == shape.params, "the plan's parameter count is off"
    config = UpdateConfig(lr=1e-6, kl_coef=0.0, diagnostics=False, dtype=dtype,
                          grad_checkpointing=grad_checkpointing, token_budget=token_budget)
    first = run_update(copy.deepcopy(records), role="agent", model=model, config=config)
    # a second step: AdamW's moments exist from the first, so this is the steady state the plan describes
    metrics = run_update(copy.deepcopy(records), role="agent", model=model, config=config,
                         optimizer=first.optimizer).metrics
    peak = torch.cuda.max_memory_allocated() - base if on_gpu else None
    del model, first
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return peak, metrics


def tiny_smollm2_llama(tokenizer):
    """The tests' tiny random Llama over the SmolLM2 tokenizer (tests/conftest.py's tiny_lm)."""
    from test_update_support import smollm2_llama_config
    from transformers import LlamaForCausalLM

    config = smollm2_llama_config(tokenizer, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                  num_key_value_heads=2)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    folder = os.environ.get("COSEARCH_GPU_CHECK_TOKENIZER")
    try:
        if folder:
            tokenizer = AutoTokenizer.from_pretrained(folder)
        else:
            from cosearch_cli.models import load_tokenizer

            tokenizer = load_tokenizer("smollm2")
    except Exception as exc:
        raise Skip(f"no SmolLM2 tokenizer ({type(exc).__name__}: {exc}); set COSEARCH_GPU_CHECK_TOKENIZER to a "
                   "folder holding its tokenizer files") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def cosearch(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "cosearch_cli", *args], cwd=ROOT, capture_output=True,
                            text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"cosearch {args[0]} exited {result.returncode}: {result.stderr.strip()[-1500:]}")
    return result


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

    from cosearch_cli.memory_plan import KNOWN, ModelShape

    if DEVICE == "cuda":
        names = os.environ.get("COSEARCH_GPU_CHECK_PLAN_MODEL", "Qwen/Qwen2.5-3B-Instruct").split(",")
        shapes, length, budget = [KNOWN[name.strip()] for name in names], 1024, 2048
    else:  # a CPU rehearsal runs the same code on a small shape
        shapes = [ModelShape("small", layers=2, hidden=128, intermediate=344, vocab=1024, heads=4, kv_heads=2,
                             tied=False, qkv_bias=True)]
        length, budget = 128, 256
    # (dtype, gradient checkpointing, micro-batch tokens): bf16 (the presets') and fp32, each both ways and with
    # a micro-batch twice as large
    cases = [("bfloat16", False, budget), ("bfloat16", True, budget), ("bfloat16", False, 2 * budget),
             ("float32", False, budget), ("float32", True, budget), ("float32", False, 2 * budget)]
    for shape in shapes:
        @check(f"memory {shape.name}")
        def _():
            records = [scored_record_of(shape.vocab, q, length) for q in range(2)]
            parts, ok = [], True
            for dtype, checkpointing, tokens in cases:
                mode = f"{dtype}, checkpointing {'on' if checkpointing else 'off'}, micro-batch {tokens}"
                planned = measured_plan(shape, records, dtype, checkpointing, tokens)
                try:
                    peak, m = measured_update(shape, records, dtype, checkpointing, tokens)
                except torch.OutOfMemoryError:  # right only if the plan said it would not fit
                    gpu = torch.cuda.get_device_properties(0).total_memory
                    ok = ok and planned > gpu
                    parts.append(f"{mode}: out of GPU memory; planned {planned / 2**30:.2f} GiB of "
                                 f"{gpu / 2**30:.2f} ({'agrees' if planned > gpu else 'the plan said it fits'})")
                    continue
                if peak is None:
                    parts.append(f"{mode}: planned {planned / 2**30:.3f} GiB (no peak on cpu), loss {m['loss']:.4f}")
                    continue
                ok = ok and peak <= planned
                parts.append(f"{mode}: measured peak {peak / 2**30:.2f} GiB, planned {planned / 2**30:.2f} GiB "
                             f"(plan / measured {planned / peak:.3f}), {m['tokens_per_s']:.0f} tokens/s")
            return ok, (f"{shape.params / 1e9:.2f} B params, two update steps of 8 sequences of {length} tokens; "
                        + "; ".join(parts))

    @check("train")
    def _():
        missing = [m for m in ("polars", "bm25s", "Stemmer") if importlib.util.find_spec(m) is None]
        if missing:
            raise Skip(f"needs {', '.join(missing)} (pip install them, or carry their wheels in COSEARCH_WHEELS)")
        tokenizer = smollm2_tokenizer()
        work = Path(tempfile.mkdtemp(prefix="cosearch-gpu-check-"))
        tiny_smollm2_llama(tokenizer).save_pretrained(work / "model")
        tokenizer.save_pretrained(work / "model")
        cosearch("index", "build", "--corpus", "fixtures/corpus.jsonl", "--out", str(work / "index"), "--quiet")
        dtype = "bfloat16" if DEVICE == "cuda" else "float32"
        (work / "train.toml").write_text(
            f'name = "gpu-check"\nout = "{work / "runs"}"\nindex = "{work / "index"}"\nagent = "{work / "model"}"\n'
            f'ranker_model = "{work / "model"}"\nconstrain = "agent,ranker"\niterations = 2\n'
            "questions_per_iteration = 2\nn = 4\nkmin = 2\nmax_turns = 1\nmax_new_tokens = 24\ntop_n = 4\nk = 2\n"
            "eval_limit = 4\neval_every = 0\nlr = 1e-3\nkl_coef = 0.001\nseed = 3\n")
        started = time.perf_counter()
        cosearch("train", "--config", str(work / "train.toml"), "--device", DEVICE, "--dtype", dtype, "--quiet")
        seconds = time.perf_counter() - started
        import orjson
        import polars as pl
        from transformers import AutoModelForCausalLM

        root = work / "runs" / "gpu-check"
        log = pl.read_parquet(root / "metrics.parquet")
        # A random model earns no reward, so train skips its updates: update the agent from the same rollouts
        # with advantages set by hand (+1/-1 alternating, the group kept), through `cosearch update` on DEVICE.
        scored = [orjson.loads(line) for line in (root / "iter-0000" / "scored.jsonl").read_bytes().splitlines()]
        for record in scored:
            for i, traj in enumerate(record["trajectories"]):
                traj["advantage"] = 1.0 if i % 2 == 0 else -1.0
            for group in record["groups"]:
                group["kept"] = group["role"] == "agent"
        (work / "signal.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in scored))
        update = cosearch("update", "--role", "agent", "--model", str(work / "model"), "--out", str(work / "step"),
                          "--device", DEVICE, "--dtype", dtype, "--kl-coef", "0.001", "--lr", "1e-4",
                          str(work / "signal.jsonl"))
        metrics = orjson.loads(update.stdout.splitlines()[0])
        before = AutoModelForCausalLM.from_pretrained(work / "model")
        after = AutoModelForCausalLM.from_pretrained(work / "step")
        moved = max(float((a - b).abs().max()) for a, b in zip(after.parameters(), before.parameters()))
        ok = log["iteration"].to_list() == [-1, 0, 1] and abs(metrics["ratio"] - 1) < 0.05 and moved > 0
        return ok, (f"{dtype} on {DEVICE}, 2 iterations in {seconds:.0f} s; metrics iterations "
                    f"{log['iteration'].to_list()}, train reward {log['train_reward'].to_list()} (a random "
                    f"model: updates skipped); then `cosearch update` of the agent on its rollouts with hand-set "
                    f"advantages: {metrics['sequences']} sequences, loss {metrics['loss']:.4f}, ratio "
                    f"{metrics['ratio']:.4f}, checkpoint loads in transformers, largest weight change {moved:.2e}")

    if DEVICE == "cuda":
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"SUMMARY: {'PASS' if not failed else 'FAIL'} ({len(RESULTS) - len(failed)}/{len(RESULTS)} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else "")
          + (f"; skipped: {', '.join(name for name, _ in SKIPPED)}" if SKIPPED else "") + f") on {DEVICE}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
