"""Checkpoints as plain Hugging Face folders that transformers and vLLM load directly.

A folder holds the weights (one safetensors file, or a peft adapter when LoRA is not merged), the tokenizer,
`cosearch_update.json` (the resolved update config, role, model and reference), `metrics.json`,
`manifest.json`, and `optimizer.pt` so that `--resume` continues exactly where the run stopped. The folder is
written beside the target and renamed into place, so a failed save leaves nothing half-written.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import orjson
import torch

from cosearch_cli.artifacts import sweep_temporaries, temporary_path, write_json_atomic
from cosearch_cli.errors import ModelError, OutputExists
from cosearch_cli.update import distributed
from cosearch_cli.update.config import UpdateConfig

INFO_FILE = "cosearch_update.json"
OPTIMIZER_FILE = "optimizer.pt"


def is_peft(model) -> bool:
    return hasattr(model, "peft_config")


def save_checkpoint(out: str | Path, *, model, tokenizer, config: UpdateConfig, optimizer=None,
                    info: dict | None = None, metrics: dict | None = None, manifest: dict | None = None,
                    merge_lora: bool = False, overwrite: bool = False) -> Path | None:
    """Write the checkpoint folder. Under torchrun every rank calls this (FSDP gathers); rank 0 writes."""
    out = Path(out)
    state = distributed.full_state_dict(model) if distributed.is_sharded(model) else None
    optim_state = distributed.full_optimizer_state(model, optimizer) if optimizer is not None else None
    if not distributed.is_main():
        distributed.barrier()
        return None
    _refuse_existing(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_temporaries(out.parent)  # e.g. the half-saved checkpoint of a run killed with -9
    tmp = temporary_path(out)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if is_peft(model) and merge_lora:
            copy.deepcopy(model).merge_and_unload().save_pretrained(tmp)
        else:
            model.save_pretrained(tmp, state_dict=state)
        tokenizer.save_pretrained(tmp)
        write_json_atomic(tmp / INFO_FILE, {"config": config.to_dict(), "lora_merged": merge_lora,
                                            **(info or {})})
        if metrics is not None:
            write_json_atomic(tmp / "metrics.json", metrics)
        if manifest is not None:
            write_json_atomic(tmp / "manifest.json", manifest)
        if optim_state is not None and not (is_peft(model) and merge_lora):
            torch.save({"optimizer": optim_state, "lora": is_peft(model)}, tmp / OPTIMIZER_FILE)
        _refuse_existing(out, overwrite)  # again: another process may have written it meanwhile
        if out.is_dir():
            shutil.rmtree(out)
        elif out.exists():
            out.unlink()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        distributed.barrier()
    return out


def _refuse_existing(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise OutputExists(f"{out} already exists", fix="pass --overwrite to replace it, or choose another --out")


def read_info(folder: str | Path) -> dict:
    """The update info saved in a checkpoint folder, or {} for a folder that no update wrote."""
    path = Path(folder) / INFO_FILE
    return orjson.loads(path.read_bytes()) if path.is_file() else {}


def load_optimizer_state(folder: str | Path) -> dict:
    path = Path(folder) / OPTIMIZER_FILE
    if not path.is_file():
        raise ModelError(f"{folder} has no {OPTIMIZER_FILE}, so it cannot be resumed exactly",
                         fix="resume from a folder written by `cosearch update` without --merge-lora")
    return torch.load(path, map_location="cpu", weights_only=True)["optimizer"]
