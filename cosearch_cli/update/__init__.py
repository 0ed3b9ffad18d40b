"""The update stage: one GRPO step for the agent or the ranker from scored rollout records.

    batch.py        scored records -> training sequences -> length-sorted micro-batches
    logprobs.py     log-probs of the recorded tokens under a model
    losses.py       GRPO per-token terms (ratio, clipping, k3 KL) and the table of loss aggregations
    step.py         run_update: accumulation, clipping, AdamW, non-finite guard
    checkpoint.py   plain Hugging Face folders with optimiser state for exact resume
    distributed.py  DDP / FSDP under torchrun
"""

from cosearch_cli.update.checkpoint import load_optimizer_state, read_info, save_checkpoint
from cosearch_cli.update.config import UpdateConfig
from cosearch_cli.update.losses import LOSS_AGG
from cosearch_cli.update.step import UpdateResult, make_optimizer, run_update

__all__ = ["LOSS_AGG", "UpdateConfig", "UpdateResult", "load_optimizer_state", "make_optimizer", "read_info",
           "run_update", "save_checkpoint"]
