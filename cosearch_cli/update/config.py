"""The update stage's settings: one flat dataclass, defaults from the references (METHOD.md)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from cosearch_cli.errors import ConfigError

ROLES = ("agent", "ranker")
PARALLEL = ("ddp", "fsdp")
NORM_OVER = ("batch", "trained")


@dataclass
class UpdateConfig:
    lr: float = 1e-6
    """AdamW learning rate (references: 1e-6)."""
    clip_low: float = 0.2
    """The ratio is clipped below at 1 - clip_low."""
    clip_high: float = 0.2
    """The ratio is clipped above at 1 + clip_high (0.28 is the DAPO 'clip higher' setting)."""
    kl_coef: float = 0.001
    """Weight of the k3 KL estimate to the frozen reference; 0 skips the reference forward pass."""
    loss_agg: str = "token-mean"
    """How per-token losses become one number: token-mean, seq-mean-token-mean, seq-mean-token-sum-norm."""
    norm_over: str = "batch"
    """Whose tokens divide the loss: batch (every response token of the role's groups, advantage 0 or not, as
    verl and Search-R1 count) or trained (only non-zero-advantage sequences: the step grows as fewer groups
    carry signal; the behaviour before 2026-12)."""
    norm_tokens: int | None = None
    """Divisor for seq-mean-token-sum-norm; None uses the most trained tokens of any sequence in the batch."""
    token_budget: int = 2048
    """Padded tokens per micro-batch (rows x longest row); gradients accumulate over micro-batches."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this (0 turns clipping off; the norm is still reported)."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    lora_r: int = 0
    """LoRA rank through peft; 0 trains all weights."""
    lora_alpha: int = 0
    """LoRA alpha; 0 means 2 x lora_r."""
    grad_checkpointing: bool = False
    """Recompute activations in the backward pass: about 25% slower, much less memory."""
    diagnostics: bool = True
    """After the step, measure KL(new || old) on the batch (one more forward pass over it) and, when held-out
    sequences are given, on them."""
    parallel: str = "ddp"
    """Under torchrun: ddp (every process holds the whole model) or fsdp (parameters sharded)."""
    dtype: str = "float32"
    """Compute dtype: float32, or bfloat16 (autocast over fp32 master weights, gradients and AdamW state;
    under FSDP bf16 parameter gathering with fp32 gradient reduction). See update/precision.py."""
    offload: bool = False
    """FSDP only: keep the sharded fp32 weights, gradients and AdamW state in host memory (CPU offload)."""
    recompute_old: bool = False
    """Recompute the old log-probs with the trainer before the step instead of trusting the rollout engine's
    (the engine/trainer gap is logged either way when on; see update/old_logprobs.py)."""
    tis_cap: float = 0.0
    """Truncated importance sampling: weight each token's policy loss by min(p_trainer / p_engine, cap) of the
    old policy (needs recompute_old). 0: off."""
    seed: int = 0
    """Recorded with the checkpoint; the update itself draws no random numbers (dropout stays off)."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        from cosearch_cli.update.losses import LOSS_AGG

        if self.loss_agg not in LOSS_AGG:
            raise ConfigError(f"unknown loss aggregation {self.loss_agg!r}",
                              fix=f"use one of {', '.join(LOSS_AGG)}")
        if self.norm_over not in NORM_OVER:
            raise ConfigError(f"unknown norm-over {self.norm_over!r}", fix=f"use one of {', '.join(NORM_OVER)}")
        if self.dtype not in ("float32", "bfloat16"):
            raise ConfigError(f"unknown dtype {self.dtype!r}", fix="use float32 or bfloat16")
        if self.tis_cap and not self.recompute_old:
            raise ConfigError("tis-cap needs the trainer's old log-probs", fix="turn recompute-old-logprobs on")
        if self.parallel not in PARALLEL:
            raise ConfigError(f"unknown parallel mode {self.parallel!r}", fix=f"use one of {', '.join(PARALLEL)}")
        numbers = {"lr": self.lr, "clip-low": self.clip_low, "clip-high": self.clip_high, "kl-coef": self.kl_coef,
                   "max-grad-norm": self.max_grad_norm, "weight-decay": self.weight_decay, "eps": self.eps}
        for name, value in numbers.items():
            if not math.isfinite(value):
                raise ConfigError(f"{name} must be a finite number, got {value}",
                                  fix="see `cosearch update --help` for the allowed values")
        checks = [
            (self.lr > 0, "lr must be > 0"),
            (0 <= self.clip_low < 1, "clip-low must be in [0, 1)"),
            (self.clip_high >= 0, "clip-high must be >= 0"),
            (self.kl_coef >= 0, "kl-coef must be >= 0"),
            (self.token_budget > 0, "token-budget must be > 0"),
            (self.max_grad_norm >= 0, "max-grad-norm must be >= 0"),
            (self.lora_r >= 0, "lora rank must be >= 0"),
            (self.norm_tokens is None or self.norm_tokens > 0, "norm-tokens must be > 0"),
            (self.tis_cap == 0 or self.tis_cap >= 1, "tis-cap must be 0 (off) or >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message, fix="see `cosearch update --help` for the allowed values")

    def to_dict(self) -> dict:
        return asdict(self)
