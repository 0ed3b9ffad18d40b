"""Generation backends: a batch of prompts in, sampled token ids, text and log-probabilities out."""

from __future__ import annotations

from cosearch_cli.errors import ConfigError

BACKENDS = ("hf", "vllm")


def load_backend(name_or_path: str, backend: str = "hf", **kwargs):
    """A GenerationBackend for the embedded model ('smollm2') or a local Hugging Face folder."""
    if backend == "hf":
        from cosearch_cli.generation.hf import HFBackend

        return HFBackend.load(name_or_path, **kwargs)
    if backend == "vllm":
        from cosearch_cli.generation.vllm import VLLMBackend

        return VLLMBackend.load(name_or_path, **kwargs)
    raise ConfigError(f"unknown generation backend {backend!r}", fix=f"use one of {', '.join(BACKENDS)}")
