"""The GRPO loss, term by term, and the one table of ways to aggregate per-token losses.

Every aggregation returns this micro-batch's share of the whole batch's loss: the divisors (`Norms`) are
batch-wide, so summing the shares of all micro-batches (and of all processes) gives exactly the loss of the
full batch, and gradient accumulation changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cosearch_cli.update.batch import Norms


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The low-variance KL estimate (Schulman's k3): exp(ref - pi) - (ref - pi) - 1, >= 0, 0 when equal."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


@dataclass
class TokenTerms:
    loss: torch.Tensor  # per-token loss to aggregate
    pg_loss: torch.Tensor
    kl: torch.Tensor | None
    clipped: torch.Tensor  # bool: the clipped objective was the active one
    ratio: torch.Tensor


def grpo_token_terms(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                     ref_logp: torch.Tensor | None, *, clip_low: float, clip_high: float,
                     kl_coef: float) -> TokenTerms:
    ratio = torch.exp(logp - old_logp)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg_loss = torch.maximum(pg_loss1, pg_loss2)
    clipped = pg_loss2 > pg_loss1
    kl = None
    loss = pg_loss
    if ref_logp is not None and kl_coef > 0:
        kl = k3_kl(logp, ref_logp)
        loss = pg_loss + kl_coef * kl
    return TokenTerms(loss, pg_loss, kl, clipped, ratio)


# Each takes per-token values, the trained-token count of each token's sequence, and the batch-wide norms.


def token_mean(values: torch.Tensor, seq_tokens: torch.Tensor, norms: Norms) -> torch.Tensor:
    """Every trained token of the batch weighs the same (references' default)."""
    return values.sum() / norms.tokens


def seq_mean_token_mean(values: torch.Tensor, seq_tokens: torch.Tensor, norms: Norms) -> torch.Tensor:
    """Mean over tokens within a sequence, then mean over sequences (original GRPO)."""
    return (values / seq_tokens).sum() / norms.seqs


def seq_mean_token_sum_norm(values: torch.Tensor, seq_tokens: torch.Tensor, norms: Norms) -> torch.Tensor:
    """Token sum per sequence over a constant horizon, mean over sequences (Dr. GRPO: no length bias)."""
    return (values / norms.horizon).sum() / norms.seqs


LOSS_AGG = {
    "token-mean": token_mean,
    "seq-mean-token-mean": seq_mean_token_mean,
    "seq-mean-token-sum-norm": seq_mean_token_sum_norm,
}
