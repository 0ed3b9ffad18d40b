"""Mixed precision of the update: fp32 master weights, gradients and AdamW state, bf16 compute.

The weights stay fp32 so that AdamW's small steps are not lost to bf16 rounding (at lr 1e-6 an update is
below bf16's resolution near 1.0); the forward and backward passes run in bf16 under autocast, which halves
activation memory and uses the GPU's bf16 units. Under FSDP the same split is FSDP's MixedPrecisionPolicy
(bf16 parameter gathering, fp32 gradient reduction; see distributed.shard_fsdp). The log-softmax of the loss
is taken in fp32 either way (logprobs.token_logprobs casts the logits).
"""

from __future__ import annotations

import contextlib

import torch

DTYPES = ("float32", "bfloat16")


def compute_context(device: torch.device, dtype: str):
    """bf16 autocast on `device`'s type, or nothing for fp32."""
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))


class Autocast:
    """Calls `module` under bf16 autocast; every other attribute is the module's own (no_sync, parameters...)."""

    def __init__(self, module, dtype: str):
        self.module = module
        self.dtype = dtype

    def __call__(self, *args, **kwargs):
        from cosearch_cli.update.distributed import compute_device

        device = compute_device(self.module)
        with compute_context(device, self.dtype):
            return self.module(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.module, name)


def compute_in(module, dtype: str):
    """`module` itself for fp32, else a wrapper that runs its forward passes under autocast."""
    if dtype not in DTYPES:
        from cosearch_cli.errors import ConfigError

        raise ConfigError(f"unknown dtype {dtype!r}", fix=f"use one of {', '.join(DTYPES)}")
    return module if dtype == "float32" else Autocast(module, dtype)
