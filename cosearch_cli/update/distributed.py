"""Running one update over several processes started by torchrun.

Every process reads the whole batch, so batch-wide divisors need no communication; each takes every
world-th sequence of the length-sorted list (balanced work), and gradients are averaged by DDP (gloo on CPU,
NCCL on GPU) or reduce-scattered by FSDP. Losses are scaled by the world size so the average is the sum.
"""

from __future__ import annotations

import contextlib
import os
import weakref

import torch
import torch.distributed as dist

_FSDP_DONE: "weakref.WeakSet" = weakref.WeakSet()
_OFFLOADED: "weakref.WeakSet" = weakref.WeakSet()  # sharded with CPU offload: parameters on the CPU, compute on GPU


def compute_device(module) -> torch.device:
    """Where a forward pass's inputs must go: the parameters' device, except for a model sharded with CPU
    offload, whose parameters live on the CPU but compute on this process's GPU. Sees through wrappers
    (DDP, the bf16 autocast wrapper) via their `.module`."""
    inner = getattr(module, "module", module)
    if module in _OFFLOADED or inner in _OFFLOADED:
        return torch.device("cuda", torch.cuda.current_device())
    return next(module.parameters()).device


def init_from_env() -> None:
    """Join the process group torchrun describes in the environment; a single process does nothing."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")


def rank_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return rank_world()[0] == 0


def _comm_device() -> torch.device:
    """NCCL reduces only GPU tensors; gloo only CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum over processes (a new CPU tensor when there are several)."""
    if rank_world()[1] == 1:
        return tensor
    moved = tensor.to(_comm_device())
    dist.all_reduce(moved, op=dist.ReduceOp.SUM)
    return moved.cpu()


def all_reduce_max(value: int) -> int:
    if rank_world()[1] == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.long, device=_comm_device())
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def barrier() -> None:
    if rank_world()[1] > 1:
        dist.barrier()


def init_local_group() -> None:
    """A process group of this one process, so FSDP (CPU offload) can run inside `cosearch train`."""
    if dist.is_initialized():
        return
    import socket

    with socket.socket() as probe:  # a free port for the rendezvous of a group of one
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                            init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def wrap(model, parallel: str, *, dtype: str = "float32", offload: bool = False):
    """The module to run forward/backward through: the model itself, a DDP wrapper, or the sharded model
    (FSDP also on a group of one process, for its mixed precision and CPU offload)."""
    if parallel == "fsdp" and dist.is_available() and dist.is_initialized():
        return shard_fsdp(model, dtype=dtype, offload=offload)
    if rank_world()[1] == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    device_ids = [torch.cuda.current_device()] if next(model.parameters()).is_cuda else None
    return DDP(model, device_ids=device_ids)


def shard_fsdp(model, *, dtype: str = "float32", offload: bool = False):
    """FSDP2 full shard of every decoder layer, then the rest; done once per model object. bfloat16: parameters
    are gathered in bf16 and gradients reduced in fp32 (the sharded master weights stay fp32); offload keeps
    the shards, their gradients and the optimiser state in host memory."""
    if model in _FSDP_DONE:
        return model
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if offload and not torch.cuda.is_available():
        from cosearch_cli.errors import ConfigError

        raise ConfigError("CPU offload needs a GPU to compute on", fix="drop --offload (offload = false) on a CPU")
    options = {"offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy()}
    if dtype != "float32":
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, dtype), reduce_dtype=torch.float32)
    layers = getattr(model.get_decoder(), "layers", [])
    for layer in layers:
        fully_shard(layer, **options)
    fully_shard(model, **options)
    _FSDP_DONE.add(model)
    if offload:
        _OFFLOADED.add(model)
    return model


@contextlib.contextmanager
def grad_sync(module, sync: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulation."""
    if hasattr(module, "no_sync") and not sync:
        with module.no_sync():
            yield
    elif hasattr(module, "set_requires_gradient_sync"):
        module.set_requires_gradient_sync(sync)
        yield
    else:
        yield


def is_sharded(model) -> bool:
    return model in _FSDP_DONE


def full_state_dict(model) -> dict:
    """The whole model's weights on CPU (a collective under FSDP: every rank must call it)."""
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def full_optimizer_state(model, optimizer) -> dict:
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(model, optimizer, state: dict) -> None:
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=False))
