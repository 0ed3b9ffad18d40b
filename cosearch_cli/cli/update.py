"""`cosearch update`: one GRPO step for the agent or the ranker; writes a plain Hugging Face checkpoint."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import orjson
import typer

from cosearch_cli.artifacts import Reader, Writer, make_manifest, mark_partial
from cosearch_cli.cli import app
from cosearch_cli.cli.common import (AllowPartial, Dtype, Inputs, Overwrite, Quiet, Seed, Threads, hold_output_lock,
                                     progress, refuse_existing, stderr, use_threads)
from cosearch_cli.cli.group import no_records
from cosearch_cli.errors import ConfigError, NothingToDo
from cosearch_cli.records import read_rollout

Opt = typer.Option


@app.command("update")
def update(
    inputs: Inputs,
    out: Annotated[str, Opt(help="Checkpoint folder to write (weights, tokenizer, config, optimiser state).")],
    role: Annotated[str, Opt(help="Which model to train: agent (trajectories of kept agent groups) or ranker "
                                  "(ranker calls of kept ranker groups).")] = "agent",
    model: Annotated[Optional[str], Opt(help="Policy to update: a Hugging Face folder or 'smollm2'. "
                                             "Defaults to --resume's folder.")] = None,
    ref: Annotated[Optional[str], Opt(help="Frozen reference for the KL term; default: the reference recorded "
                                           "in --model's folder by an earlier update, else --model itself.")] = None,
    resume: Annotated[Optional[str], Opt(help="Continue from a checkpoint this command wrote: its weights and "
                                              "its optimiser state, so the run continues exactly.")] = None,
    lr: Annotated[float, Opt(help="AdamW learning rate (references: 1e-6).")] = 1e-6,
    clip_low: Annotated[float, Opt(help="Ratio clipped below at 1 - clip-low.")] = 0.2,
    clip_high: Annotated[float, Opt(help="Ratio clipped above at 1 + clip-high (DAPO uses 0.28).")] = 0.2,
    kl_coef: Annotated[float, Opt(help="Weight of the k3 KL to the reference; 0 skips the reference "
                                       "model entirely.")] = 0.001,
    loss_agg: Annotated[str, Opt(help="token-mean (references), seq-mean-token-mean (original GRPO) or "
                                      "seq-mean-token-sum-norm (Dr. GRPO).")] = "token-mean",
    norm_tokens: Annotated[Optional[int], Opt(help="Divisor of seq-mean-token-sum-norm; default: the most "
                                                   "trained tokens of any sequence in the batch.")] = None,
    token_budget: Annotated[int, Opt(help="Padded tokens per micro-batch; gradients accumulate over "
                                          "micro-batches, so this bounds memory, not the update.")] = 2048,
    max_grad_norm: Annotated[float, Opt(help="Clip the gradient norm to this; 0 = no clipping.")] = 1.0,
    weight_decay: Annotated[float, Opt(help="AdamW weight decay.")] = 0.01,
    lora: Annotated[int, Opt(help="Train a LoRA adapter of this rank (peft) instead of all weights; 0 = off.")] = 0,
    lora_alpha: Annotated[int, Opt(help="LoRA alpha; 0 = 2 x rank.")] = 0,
    merge_lora: Annotated[bool, Opt(help="Save LoRA merged into full weights (loads anywhere, cannot be "
                                         "resumed); default saves the adapter.")] = False,
    grad_checkpointing: Annotated[bool, Opt(help="Recompute activations in backward: slower, less memory.")]
    = False,
    parallel: Annotated[str, Opt(help="Under torchrun: ddp (full model per process) or fsdp (sharded).")] = "ddp",
    device: Annotated[str, Opt(help="cpu, cuda, or auto (cuda when available; under torchrun the local rank's "
                                    "GPU).")] = "auto",
    dtype: Annotated[str, Opt(help="Compute dtype: float32, or bfloat16 (autocast over fp32 master weights, "
                                   "gradients and AdamW state; FSDP gathers bf16 and reduces fp32).")] = "float32",
    offload: Annotated[bool, Opt(help="With --parallel fsdp: keep the sharded weights, gradients and AdamW state "
                                      "in host memory.")] = False,
    recompute_old_logprobs: Annotated[str, Opt(
        help="Recompute the old log-probs with the trainer before the step: on, off, or auto (on when the "
             "rollout manifest shows another backend, dtype or device than this update's).")] = "auto",
    tis_cap: Annotated[float, Opt(help="Truncated importance sampling: weight each token's policy loss by "
                                       "min(p_trainer / p_engine, cap) (needs recomputed old log-probs); "
                                       "0 = off.")] = 0.0,
    overwrite: Overwrite = False,
    allow_partial: AllowPartial = False,
    seed: Seed = 0,
    threads: Threads = None,
    quiet: Quiet = False,
) -> None:
    """One GRPO update from scored rollouts; prints its metrics as one JSON line (then the manifest).

    Example: cosearch update --role agent --model smollm2 --out ckpt/1 scored.jsonl

    Under torchrun (`torchrun --nproc_per_node K -m cosearch_cli update ...`) the processes split the
    batch (DDP; gloo on CPU, NCCL on GPU) and rank 0 writes the checkpoint. A step whose loss or gradient
    is not finite is skipped: its metrics are printed, no checkpoint is written, and the exit code is 7.
    """
    import torch

    from cosearch_cli.update import (UpdateConfig, load_optimizer_state, read_info, run_update,
                                     save_checkpoint)
    from cosearch_cli.update import distributed, old_logprobs
    from cosearch_cli.update.batch import training_sequences

    if role not in ("agent", "ranker"):
        raise ConfigError(f"unknown role {role!r}", fix="use --role agent or --role ranker")
    if model is None and resume is None:
        raise ConfigError("no model to update", fix="pass --model DIR|smollm2, or --resume DIR")
    if model is not None and resume is not None:
        raise ConfigError("--model and --resume both given", fix="--resume already names the weights; drop --model")
    refuse_existing(out, overwrite)
    if recompute_old_logprobs not in ("auto", "on", "off"):
        raise ConfigError(f"--recompute-old-logprobs {recompute_old_logprobs!r}", fix="use auto, on or off")
    config = UpdateConfig(lr=lr, clip_low=clip_low, clip_high=clip_high, kl_coef=kl_coef, loss_agg=loss_agg,
                          norm_tokens=norm_tokens, token_budget=token_budget, max_grad_norm=max_grad_norm,
                          weight_decay=weight_decay, lora_r=lora, lora_alpha=lora_alpha,
                          grad_checkpointing=grad_checkpointing, parallel=parallel, dtype=dtype, offload=offload,
                          recompute_old=tis_cap > 0, tis_cap=tis_cap, seed=seed)

    reader = Reader.open(inputs, stage_stream=True, allow_partial=allow_partial)
    records = [read_rollout(row.data, row.path, row.line, min_stage="scored") for row in reader.rows()]
    if not records:
        raise no_records(inputs)
    device_type = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    engine = old_logprobs.rollout_engine(reader.upstream)
    recompute = old_logprobs.resolve(recompute_old_logprobs, engine, device=device_type, dtype=dtype)
    config = replace(config, recompute_old=recompute or (tis_cap > 0 and recompute_old_logprobs != "off"))
    seqs = training_sequences(records, role)
    if not seqs:  # before any model is loaded
        raise NothingToDo(f"no trainable {role} sequences in {len(records)} records: no kept {role} group has "
                          "a non-zero advantage", fix="check the reward stage's output; nothing was written")

    distributed.init_from_env()
    use_threads(threads, quiet or not distributed.is_main())
    if parallel == "fsdp":  # also on one process: FSDP's mixed precision and CPU offload
        distributed.init_local_group()
    if distributed.is_main():
        hold_output_lock(out)  # a second writer of --out stops here
        refuse_existing(out, overwrite)
    torch.manual_seed(seed)
    policy_name = resume or model
    info = read_info(policy_name) if Path(policy_name).is_dir() else {}
    if device_type.startswith("cuda"):  # refuse before any model is loaded when the update cannot fit the GPU
        _check_update_memory(policy_name, config, seqs, quiet=quiet)
    if device == "auto":
        device = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    policy, tokenizer = _load_policy(policy_name, config, "cpu" if offload else device)  # FSDP places shards
    ref_name = ref or info.get("ref") or policy_name
    ref_model = _load_reference(ref_name, device, dtype) if config.kl_coef > 0 else None
    optimizer_state = load_optimizer_state(resume) if resume else None

    with progress(quiet or not distributed.is_main()) as bar:
        task = bar.add(f"update {role}", unit="micro-batches")
        result = run_update(records, role=role, model=policy, ref_model=ref_model, config=config,
                            optimizer_state=optimizer_state, pad_id=tokenizer.pad_token_id or 0,
                            on_micro_batch=lambda done, total: bar.update(task, done=done, total=total))
    step = info.get("step", 0) + (0 if result.skipped else 1)
    metrics = {"kind": "update_metrics", "step": step, **result.metrics}
    options = {"role": role, "model": model, "ref": ref_name if ref_model is not None else None,
               "resume": resume, "out": out, **config.to_dict(), "merge_lora": merge_lora}
    manifest = mark_partial(make_manifest("update", options, inputs=reader.hashes, seed=seed,
                                          upstream=reader.upstream), [reader])
    if result.skipped:  # the previous weights stand: nothing to save
        if distributed.is_main():
            with Writer("-", manifest=manifest) as writer:
                writer.write(metrics)
        raise NothingToDo(f"the update was skipped ({metrics['skip_reason']}); no checkpoint was written",
                          path=out, fix="lower --lr or check the scored input")
    save_checkpoint(out, model=policy, tokenizer=tokenizer, config=config, optimizer=result.optimizer,
                    info={"role": role, "model": policy_name, "ref": ref_name, "step": step},
                    metrics=metrics, manifest=manifest, merge_lora=merge_lora, overwrite=overwrite)
    if not distributed.is_main():
        return
    with Writer("-", manifest=manifest) as writer:
        writer.write(metrics)
    if not quiet:
        stderr.print(f"update {role}: {metrics['sequences']} sequences, {metrics['tokens']} trained tokens, "
                     f"loss {metrics['loss']:.4g}, {metrics['seconds']:.1f} s -> {out}")


def _check_update_memory(policy_name: str, config, seqs, *, quiet: bool) -> None:
    """Print this process's memory plan (stderr) and refuse with its numbers when it does not fit the GPU."""
    import torch

    from cosearch_cli.memory_plan import UpdateSettings, batch_extent, model_shape, plan_update, update_refusal
    from cosearch_cli.update import distributed

    if not torch.cuda.is_available():
        raise ConfigError("--device cuda but torch sees no GPU", fix="use --device cpu, or run on a GPU node")
    settings = UpdateSettings(dtype=config.dtype, grad_checkpointing=config.grad_checkpointing,
                              offload=config.offload, token_budget=config.token_budget, kl_coef=config.kl_coef)
    world = distributed.rank_world()[1] if config.parallel == "fsdp" else 1
    longest, trained = batch_extent(seqs)
    gpu_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    plan = plan_update(model_shape(policy_name), settings, gpu_bytes=gpu_bytes, world=world, longest=longest,
                       trained=trained)
    if not quiet and distributed.is_main():
        for line in plan.lines():
            stderr.print(line, markup=False, highlight=False)
    if not plan.fits:
        raise update_refusal(plan, settings, world)


def _load_policy(name: str, config, device: str):
    """The model to train; a LoRA adapter folder resumes its adapter on top of its recorded base."""
    from cosearch_cli.models import load_causal_lm

    adapter = Path(name) / "adapter_config.json"
    if adapter.is_file():
        from peft import PeftModel

        base_name = orjson.loads(adapter.read_bytes())["base_model_name_or_path"]
        base, tokenizer = load_causal_lm(base_name, device=device)
        return PeftModel.from_pretrained(base, name, is_trainable=True), tokenizer
    model, tokenizer = load_causal_lm(name, device=device)
    if config.lora_r:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha or 2 * config.lora_r,
                          target_modules="all-linear", lora_dropout=0.0, task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    return model, tokenizer


def _load_reference(name: str, device: str, dtype: str):
    """The frozen reference; under bf16 its weights are bf16 too (it is never trained)."""
    from cosearch_cli.models import load_causal_lm

    ref_model, _ = load_causal_lm(name, device=device, dtype=dtype)
    for p in ref_model.parameters():
        p.requires_grad_(False)
    return ref_model
