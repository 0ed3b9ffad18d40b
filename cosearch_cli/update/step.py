"""One GRPO update: micro-batches, gradient accumulation, clipping, AdamW, and a guard for non-finite steps.

Reads top to bottom in the order it runs. `run_update` takes model objects, so a training loop keeps its
models and optimiser in memory across iterations; the CLI is one call of it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from cosearch_cli.errors import ConfigError, NothingToDo
from cosearch_cli.records import RolloutRecord
from cosearch_cli.update import distributed, old_logprobs, precision
from cosearch_cli.update.batch import (MicroBatch, Norms, TrainSeq, batch_norms, batch_size, check_vocab,
                                       collate, plan_micro_batches, training_sequences)
from cosearch_cli.update.config import ROLES, UpdateConfig
from cosearch_cli.update.logprobs import distribution_logprobs, token_logprobs
from cosearch_cli.update.losses import LOSS_AGG, grpo_token_terms

# Sums gathered over micro-batches and processes; the metrics are ratios of them.
_SUMS = ("loss", "pg_loss", "kl", "clipped", "entropy", "ratio", "tokens", "real_tokens", "padded_tokens")


@dataclass
class UpdateResult:
    metrics: dict
    optimizer: torch.optim.Optimizer
    skipped: bool


def make_optimizer(model, config: UpdateConfig, state: dict | None = None) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; `state` (from a checkpoint) resumes it exactly."""
    params = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel: on a GPU the default (foreach) step holds a temporary as large as the fp32 weights (+4
    # bytes a parameter: on an H200 a 3B model peaked at 57.5 GiB instead of 46, and a 7B one ran out of memory
    # in optimizer.step; bench/results/gpu_check.md). On the CPU (and FSDP's CPU offload) fused is 5-7x faster
    # (148M parameters: 73-85 ms a step against 431-598; bench/adamw_step.py) with the same result to 6 digits;
    # its peak RSS there was not lower.
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, eps=config.eps,
                                  weight_decay=config.weight_decay, fused=bool(params) or None)
    if state is not None:
        distributed.load_optimizer_state(model, optimizer, state)
        for group in optimizer.param_groups:  # the options of this run win over the saved ones
            group.update(lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay)
    return optimizer


def local_micro_batches(seqs: list[TrainSeq], config: UpdateConfig, pad_id: int = 0) -> list[MicroBatch]:
    """This process's share of the batch, as micro-batches; a rank with no share gets a zero-weight one."""
    rank, world = distributed.rank_world()
    ordered = sorted(seqs, key=lambda s: (-len(s.token_ids), s.key))
    mine = ordered[rank::world]
    batches = [collate(plan, pad_id) for plan in plan_micro_batches(mine, config.token_budget)]
    # Zero-weight placeholders keep ranks in step: DDP needs one synced backward on every rank, and FSDP
    # gathers parameters in every forward, so there all ranks must run the same number of micro-batches.
    wanted = max(1, distributed.all_reduce_max(len(batches)) if config.parallel == "fsdp" else 1)
    batches += [collate(ordered[-1:], pad_id, weight=0.0) for _ in range(wanted - len(batches))]
    return batches


def accumulate_gradients(policy, ref_model, batches: list[MicroBatch], config: UpdateConfig,
                         norms: Norms, keep_logp: list | None = None,
                         on_micro_batch: Callable[[int, int], None] | None = None) -> dict[str, float]:
    """Forward and backward over the micro-batches; returns batch-wide sums (all processes) for metrics.
    `keep_logp`, when given, receives each micro-batch's log-probs before the step (for `batch_kl`);
    `on_micro_batch(done, total)` is called after each (for progress bars)."""
    aggregate = LOSS_AGG[config.loss_agg]
    world = distributed.rank_world()[1]
    sums = torch.zeros(len(_SUMS), dtype=torch.float64)
    device = distributed.compute_device(policy)
    for i, mb in enumerate(batches):
        mb = mb.to(device)
        with distributed.grad_sync(policy, sync=i == len(batches) - 1):
            logp, entropy = token_logprobs(policy, mb, with_entropy=True)
            ref_logp = None
            if config.kl_coef > 0:
                with torch.no_grad():
                    ref_logp, _ = token_logprobs(ref_model, mb)
            terms = grpo_token_terms(logp, mb.old_logprobs, mb.advantages, ref_logp, clip_low=config.clip_low,
                                     clip_high=config.clip_high, kl_coef=config.kl_coef)
            share = aggregate(terms.loss, mb.seq_tokens, norms) * mb.weight
            if keep_logp is not None:
                keep_logp.append(logp.detach())
            (share * world).backward()  # DDP/FSDP average over ranks; scaling makes that the sum
        with torch.no_grad():
            w = mb.weight
            sums += torch.tensor([
                share.item(), w * terms.pg_loss.sum().item(),
                w * terms.kl.sum().item() if terms.kl is not None else 0.0,
                w * terms.clipped.sum().item(), w * entropy.sum().item(), w * terms.ratio.sum().item(),
                w * len(logp), w * mb.real_tokens, w * mb.padded_tokens], dtype=torch.float64)
        if on_micro_batch is not None:
            on_micro_batch(i + 1, len(batches))
    sums = distributed.all_reduce_sum(sums)
    return dict(zip(_SUMS, sums.tolist()))


def batch_kl(policy, batches: list[MicroBatch], before: list[torch.Tensor]) -> float:
    """KL(new || old) per trained token of the batch, from its sampled tokens: with r = p_new / p_old at each
    token (drawn from the old policy), E_old[r log r - (r - 1)] = KL(new || old), and each term is >= 0."""
    sums = torch.zeros(2, dtype=torch.float64)
    device = distributed.compute_device(policy)
    with torch.no_grad():
        for mb, old in zip(batches, before):
            new, _ = token_logprobs(policy, mb.to(device))
            log_r = (new - old).double()
            terms = torch.exp(log_r) * log_r - torch.expm1(log_r)
            sums += torch.tensor([mb.weight * terms.sum().item(), mb.weight * len(log_r)], dtype=torch.float64)
    total, count = distributed.all_reduce_sum(sums).tolist()
    return total / count if count else 0.0


class HeldoutKL:
    """Exact KL(new || old) over the whole vocabulary at the trained positions of sequences the update does
    not train on (e.g. dev prompts): how far one step moves the model where it was not pushed."""

    def __init__(self, policy, seqs: list[TrainSeq], token_budget: int, pad_id: int):
        self.batches = [collate(plan, pad_id) for plan in plan_micro_batches(seqs, token_budget)]
        self.before = self._logprobs(policy)

    def _logprobs(self, policy) -> list[torch.Tensor]:
        device = distributed.compute_device(policy)
        with torch.no_grad():
            return [distribution_logprobs(policy, mb.to(device)) for mb in self.batches]

    def after(self, policy) -> float:
        total = count = 0.0
        for old, new in zip(self.before, self._logprobs(policy)):
            total += float((new.exp() * (new - old)).sum())
            count += new.shape[0]
        return total / count if count else 0.0


def run_update(records: Iterable[RolloutRecord], *, role: str, model, ref_model=None, config: UpdateConfig,
               optimizer: torch.optim.Optimizer | None = None, optimizer_state: dict | None = None,
               pad_id: int = 0, heldout: list[TrainSeq] | None = None,
               on_micro_batch: Callable[[int, int], None] | None = None) -> UpdateResult:
    """One optimiser step of GRPO on every trainable sequence of `role` in `records`.

    `heldout`: sequences never trained on, whose exact KL(new || old) is reported as `kl_heldout`.
    `on_micro_batch(done, total)`: called after each micro-batch's backward pass (for progress bars)."""
    assert role in ROLES, f"role must be one of {ROLES}, got {role!r}"
    started = time.perf_counter()
    records = list(records)
    seqs = training_sequences(records, role)
    if not seqs:
        raise NothingToDo(f"no trainable {role} sequences: no kept {role} group has a non-zero advantage",
                          fix="check the reward stage's output (groups[].kept, advantages); nothing was written")
    check_vocab(seqs, model.get_input_embeddings().num_embeddings)
    use_ref = config.kl_coef > 0
    if use_ref and ref_model is None:
        raise ConfigError("kl-coef > 0 needs a reference model", fix="pass --ref, or --kl-coef 0")
    norms = batch_norms(seqs, config.norm_tokens,
                        batch=batch_size(records, role) if config.norm_over == "batch" else None)
    world = distributed.rank_world()[1]
    batches = local_micro_batches(seqs, config, pad_id)

    sharded = distributed.wrap(model, config.parallel, dtype=config.dtype, offload=config.offload)
    policy = precision.compute_in(sharded, config.dtype)
    if optimizer is None:
        optimizer = make_optimizer(model, config, optimizer_state)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # Dropout stays off (eval mode) so the first ratio is exactly 1; checkpointing only runs in train mode.
    was_training = model.training
    if config.grad_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.2 name
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train(config.grad_checkpointing)
    optimizer.zero_grad(set_to_none=True)
    held = HeldoutKL(policy, heldout, config.token_budget, pad_id) if heldout and config.diagnostics else None

    gap = old_logprobs.recompute(policy, batches, tis_cap=config.tis_cap) if config.recompute_old else {}

    before: list[torch.Tensor] = []
    total = accumulate_gradients(policy, ref_model, batches, config, norms, keep_logp=before,
                                 on_micro_batch=on_micro_batch)

    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))  # the norm before clipping
    finite = math.isfinite(total["loss"]) and math.isfinite(grad_norm)
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # a skipped step leaves weights and optimiser state untouched
    model.train(False)
    kl_batch = batch_kl(policy, batches, before) if finite and config.diagnostics else None
    kl_heldout = held.after(policy) if held is not None and finite else None
    model.train(was_training)

    seconds = time.perf_counter() - started
    tokens = total["tokens"]
    metrics = {
        "role": role,
        "loss": total["loss"],
        "pg_loss": total["pg_loss"] / tokens,
        "kl": total["kl"] / tokens if use_ref else None,
        "clip_frac": total["clipped"] / tokens,
        "entropy": total["entropy"] / tokens,
        "ratio": total["ratio"] / tokens,
        "grad_norm": grad_norm,
        "grad_norm_clipped": min(grad_norm, max_norm),
        "lr": config.lr,
        "kl_batch": kl_batch,
        "kl_heldout": kl_heldout,
        "norm_tokens": norms.tokens,
        "adv_token_share": tokens / norms.tokens,
        "skipped": not finite,
        "skip_reason": None if finite else ("non-finite loss" if not math.isfinite(total["loss"])
                                            else "non-finite gradient norm"),
        "sequences": norms.seqs,
        "tokens": int(tokens),
        "real_tokens": int(total["real_tokens"]),
        "padded_tokens": int(total["padded_tokens"]),
        "padding_share": 1 - total["real_tokens"] / total["padded_tokens"],
        "micro_batches": len(batches),
        "world_size": world,
        "seconds": seconds,
        "tokens_per_s": total["real_tokens"] / seconds,
        "dtype": config.dtype,
        **gap,
    }
    return UpdateResult(metrics, optimizer, not finite)
