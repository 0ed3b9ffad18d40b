"""Log-probabilities of the recorded tokens under a model, at the temperature they were sampled with."""

from __future__ import annotations

import torch

from cosearch_cli.update.batch import MicroBatch


def token_logprobs(model, mb: MicroBatch, *, with_entropy: bool = False):
    """log_softmax(logits / temperature) at each trained token, and optionally the entropy there.

    Logits are computed only at the positions that predict a trained token (`logits_to_keep`), which skips
    the vocabulary projection on prompts and inserted passages. The entropy is a diagnostic, so it carries
    no gradient.
    """
    logp_all = distribution_logprobs(model, mb)
    logp = logp_all.gather(-1, mb.targets[:, None]).squeeze(-1)
    if not with_entropy:
        return logp, None
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def distribution_logprobs(model, mb: MicroBatch) -> torch.Tensor:
    """log_softmax(logits / temperature) over the whole vocabulary at each trained token: [N, V]."""
    out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, logits_to_keep=mb.cols_kept,
                use_cache=False)
    logits = out.logits[mb.rows, mb.cols].float() / mb.temperatures[:, None]
    return torch.log_softmax(logits, dim=-1)
