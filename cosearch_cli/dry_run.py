"""`cosearch train --dry-run`: the resolved configuration of every stage and the memory plan, with no model loaded.

The same functions guard a real run: on a GPU, `check_memory` refuses a configuration whose plan does not fit
before any work starts.
"""

from __future__ import annotations

from dataclasses import asdict

from cosearch_cli import grouping, rewards
from cosearch_cli.errors import ConfigError, ModelError
from cosearch_cli.models import resolve_device
from cosearch_cli.memory_plan import DEFAULT_GPU_GIB, GIB, MemoryPlan, plan_training, refusal


def gpu_resources(config) -> tuple[int, int, str | None]:
    """(GPUs, bytes of one GPU, a note when they were assumed rather than given or seen)."""
    import torch

    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = config.gpus or seen or 1
    if config.gpu_memory_gib:
        return gpus, int(config.gpu_memory_gib * GIB), None
    if seen:
        return gpus, torch.cuda.get_device_properties(0).total_memory, None
    return gpus, int(DEFAULT_GPU_GIB * GIB), (f"no GPU visible: planned for GPUs of {DEFAULT_GPU_GIB:g} GiB "
                                              "(set gpu_memory_gib for yours)")


def memory_plan(config) -> MemoryPlan:
    gpus, gpu_bytes, note = gpu_resources(config)
    plan = plan_training(config, gpus=gpus, gpu_bytes=gpu_bytes)
    if note:
        plan.notes.insert(0, note)
    return plan


def resolved_stages(config) -> dict:
    """What each stage of the loop is handed, as the loop builds it (cosearch_cli/train.py)."""
    from cosearch_cli.train import rollout_settings, update_settings

    engine = {"backend": config.backend, "device": config.device, "dtype": config.dtype}
    return {
        "rollout": {**rollout_settings(config, greedy=False, seed=config.seed * 1000).sampling(), **engine},
        "evaluate": {**rollout_settings(config, greedy=True, seed=config.seed).sampling(), **engine},
        "group": asdict(grouping.resolve_config(config.group_preset, kmin=config.kmin, tau=config.tau)),
        "reward": asdict(rewards.resolve_config(config.reward_preset)),
        "update": {**update_settings(config, 0, resolve_device(config.device)).to_dict(),
                   "device": config.device},
    }


def dry_run(config) -> tuple[dict, MemoryPlan | None]:
    """Everything `--dry-run` prints, and the memory plan (None when the run would be on the CPU)."""
    device = resolve_device(config.device)
    plan = memory_plan(config) if device != "cpu" else None
    return {"train": asdict(config), "device": device, "stages": resolved_stages(config),
            "memory": plan.to_dict() if plan else None}, plan


def check_backend(config) -> None:
    """Before a real run: a vLLM run needs vLLM importable (said now, not after the first evaluation)."""
    if config.backend != "vllm":
        return
    from cosearch_cli.generation.vllm import vllm_available

    reason = vllm_available()
    if reason:
        raise ModelError(reason, fix="pip install 'cosearch[vllm]' on the GPU node, or backend = 'hf'")


def check_memory(config) -> MemoryPlan | None:
    """Before a real run: refuse a GPU configuration that cannot fit, or a GPU asked for that is not there."""
    device = resolve_device(config.device)
    if device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"device {config.device!r} but torch sees no GPU",
                          fix="use device = 'cpu' (or 'auto'), or run on a GPU node with a CUDA build of torch")
    plan = memory_plan(config)
    if not plan.fits:
        raise refusal(plan, config)
    return plan
