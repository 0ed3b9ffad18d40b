"""Old log-probs from the trainer, and the gap between the rollout engine's numbers and the trainer's.

The GRPO ratio is p_new / p_old. The rollout records p_old as the engine computed it; when the engine is not
the trainer's own numerics (vLLM, bf16, another device) those numbers differ from what the trainer computes
for the same weights, so the first ratio is not 1 and clipping fires on noise. Recomputing p_old with the
trainer (one forward pass without gradients, before the step) makes the ratio exactly 1 at the start again.

The tokens were still sampled by the engine, though. Truncated importance sampling corrects for that: each
token's policy loss is weighted by w = min(p_trainer_old / p_engine, cap). Since w > 0, multiplying the
token's advantage by w is exactly weighting its clipped PPO term (the clipping decision is unchanged).

The gap is logged per update, over the trained tokens, with d = log p_trainer - log p_engine:
  logprob_gap_abs  mean |d|
  logprob_gap_kl   mean of exp(d) - d - 1 (the k3 estimate of KL(engine || trainer) from the engine's samples)
  tis_weight_mean  mean w, and tis_clipped the share of tokens whose weight hit the cap (when TIS is on)
"""

from __future__ import annotations

import torch

from cosearch_cli.update import distributed
from cosearch_cli.update.batch import MicroBatch
from cosearch_cli.update.logprobs import token_logprobs


def gap_terms(trainer: torch.Tensor, engine: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: |d| and exp(d) - d - 1 with d = trainer - engine (both log-probs of the sampled token)."""
    d = (trainer - engine).double()
    return d.abs(), torch.expm1(d) - d


def tis_weights(trainer: torch.Tensor, engine: torch.Tensor, cap: float) -> torch.Tensor:
    """min(p_trainer / p_engine, cap) per token."""
    return torch.exp(trainer - engine).clamp(max=cap)


def recompute(policy, batches: list[MicroBatch], *, tis_cap: float = 0.0) -> dict:
    """Replace every micro-batch's old log-probs by the trainer's (and scale its advantages by the TIS weight
    when `tis_cap` > 0); returns the gap metrics over all processes' trained tokens."""
    sums = torch.zeros(5, dtype=torch.float64)  # |d|, k3, tokens, weight, capped
    device = distributed.compute_device(policy)
    with torch.no_grad():
        for mb in batches:
            trainer, _ = token_logprobs(policy, mb.to(device))
            trainer = trainer.float().to(mb.old_logprobs.device)
            engine = mb.old_logprobs
            absolute, k3 = gap_terms(trainer, engine)
            w = mb.weight
            row = [w * absolute.sum().item(), w * k3.sum().item(), w * len(trainer), 0.0, 0.0]
            if tis_cap > 0:
                weights = tis_weights(trainer, engine, tis_cap)
                mb.advantages = mb.advantages * weights
                row[3:] = [w * weights.sum().item(), w * (weights >= tis_cap).sum().item()]
            mb.old_logprobs = trainer
            sums += torch.tensor(row, dtype=torch.float64)
    gap_abs, gap_kl, tokens, weight, capped = distributed.all_reduce_sum(sums).tolist()
    metrics = {"old_logprobs": "trainer", "logprob_gap_abs": gap_abs / tokens if tokens else 0.0,
               "logprob_gap_kl": gap_kl / tokens if tokens else 0.0}
    if tis_cap > 0:
        metrics.update(tis_cap=tis_cap, tis_weight_mean=weight / tokens if tokens else 0.0,
                       tis_clipped=capped / tokens if tokens else 0.0)
    return metrics


def rollout_engine(upstream: list[dict]) -> dict | None:
    """The backend, device and dtype of the rollout manifest among `upstream` (searched through nested
    upstream lists), or None when no rollout manifest is there."""
    for manifest in upstream:
        if manifest.get("stage") == "rollout":
            options = manifest.get("options", {})
            return {"backend": options.get("backend", "hf"), "device": options.get("device", "cpu"),
                    "dtype": options.get("dtype", "float32")}
        found = rollout_engine(manifest.get("upstream", []))
        if found is not None:
            return found
    return None


def engine_differs(engine: dict | None, *, device: str, dtype: str) -> bool:
    """Whether the rollout's log-probs were not computed with the trainer's numerics. They are the same only
    for an fp32 hf engine and an fp32 trainer on the same device type (a bf16 trainer computes with fp32
    weights under autocast, a bf16 engine with bf16 weights: not the same numbers). No rollout manifest
    (hand-made input) counts as this project's CPU default, an fp32 hf engine on the CPU, so the CPU pipeline
    behaves as before; manifests written before device and dtype were recorded mean hf, cpu, float32."""
    if engine is None:
        engine = {"backend": "hf", "device": "cpu", "dtype": "float32"}
    return (engine["backend"] != "hf" or engine["dtype"] != "float32" or dtype != "float32"
            or engine["device"].split(":")[0] != device.split(":")[0])


def resolve(mode: str, engine: dict | None, *, device: str, dtype: str) -> bool:
    """on / off / auto (on exactly when the engine's numerics differ from the trainer's)."""
    if mode == "auto":
        return engine_differs(engine, device=device, dtype=dtype)
    return mode == "on"
