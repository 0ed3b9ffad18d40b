"""The generation-backend protocol. Rollout, the evidence verifier and evaluation talk only to this.

Log-probabilities: every backend records, for each sampled token, its log-probability under the model's own
distribution at the sampling temperature, log_softmax(logits / temperature), *before* top-p filtering and
before any decoding constraint masks tokens out (greedy decoding uses temperature 1). This is exactly what
the update stage recomputes from the same token ids, so the GRPO ratio starts at 1 on the first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class Constraint(Protocol):
    """Per-sequence constrained decoding: which tokens may come next, and when the output is complete.

    A backend calls `allowed` before each sampled token with the tokens generated so far for that sequence
    (prompt excluded). It samples only among allowed tokens, and stops the sequence once `is_complete` is true.
    """

    def allowed(self, generated: Sequence[int]) -> "torch.Tensor | None":  # noqa: F821
        """A boolean mask over the vocabulary (True = allowed), or None for no restriction."""
        ...

    def is_complete(self, generated: Sequence[int]) -> bool:
        ...


@dataclass
class SamplingSettings:
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    greedy: bool = False
    stop: tuple[str, ...] = ()  # generation of a sequence ends right after the first stop string
    seed: int = 0


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    constraint: Constraint | None = None
    # The row's own sampling seed; None derives one from SamplingSettings.seed and the row's position.
    # Setting it makes a row's sample independent of which other rows share its batch.
    seed: int | None = None
    # A hint that a later request's prompt will extend this one's prompt + output (the agent's next turn):
    # a backend that can keep the sequence's encoded state does so, and skips re-encoding it then.
    keep_cache: bool = False


@dataclass
class Generation:
    token_ids: list[int]  # generated tokens only, up to and including the stop string / eos
    text: str
    logprobs: list[float]  # one per generated token (see module docstring)
    finish_reason: str = "stop"  # "stop" (stop string or eos) | "length" | "constraint"
    extra: dict = field(default_factory=dict)


class GenerationBackend(Protocol):
    name: str

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer (chat template, encode/decode)."""
        ...

    def generate(self, requests: Sequence[GenerationRequest], settings: SamplingSettings) -> list[Generation]:
        """Generate for a batch; results are in request order. Same seed and inputs give the same output."""
        ...
