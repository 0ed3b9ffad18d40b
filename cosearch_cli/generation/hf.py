"""The transformers backend: a batched sampling loop over a KV cache, written out so that it can honour
per-sequence constraints, per-sequence seeds and stop strings, and record the log-probabilities the update
stage recomputes.

Why not `model.generate`: it draws every row's randomness from one global generator (so a row's sample
depends on what else is in the batch), and it can neither record log-probs before top-p/constraint masking
nor ask a per-row constraint object which tokens are allowed.

One step of the loop, per row: logits / temperature -> log_softmax (recorded) -> constraint mask -> top-p ->
Gumbel noise from the row's own generator -> argmax. Rows that finish leave the batch (their
cache rows are dropped), so a batch costs what its longest live rows cost.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Sequence

import torch

from cosearch_cli.generation.base import Generation, GenerationRequest, SamplingSettings


def request_seed(settings_seed: int, index: int, request: GenerationRequest) -> int:
    """The seed of one row: its own if the caller set one, else derived from the batch seed and position."""
    if request.seed is not None:
        return request.seed
    return derive_seed(settings_seed, index)


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts (stable across runs and machines, unlike hash())."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class HFBackend:
    """GenerationBackend over a Hugging Face causal LM on one device."""

    name = "hf"

    def __init__(self, model, tokenizer, *, max_batch: int = 64):
        self.model = model
        self._tokenizer = tokenizer
        self.max_batch = max_batch
        self.device = next(model.parameters()).device
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.pad_id = tokenizer.pad_token_id
        self.eos_ids = _eos_ids(model, tokenizer)
        # transformers 5.x renamed `past_key_values` to `cache`; older releases only know the old name.
        self._cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    @classmethod
    def load(cls, name_or_path: str, **kwargs) -> "HFBackend":
        from cosearch_cli.models import load_causal_lm

        model, tokenizer = load_causal_lm(name_or_path)
        return cls(model, tokenizer, **kwargs)

    @property
    def tokenizer(self):
        return self._tokenizer

    @torch.inference_mode()
    def generate(self, requests: Sequence[GenerationRequest], settings: SamplingSettings) -> list[Generation]:
        # Similar lengths share a micro-batch, so little compute goes to padding.
        order = sorted(range(len(requests)), key=lambda i: len(requests[i].prompt_ids))
        results: list[Generation | None] = [None] * len(requests)
        for start in range(0, len(order), self.max_batch):
            chunk = order[start:start + self.max_batch]
            seeds = [request_seed(settings.seed, i, requests[i]) for i in chunk]
            for i, gen in zip(chunk, self._generate_batch([requests[i] for i in chunk], seeds, settings)):
                results[i] = gen
        return results

    def _generate_batch(self, requests: list[GenerationRequest], seeds: list[int],
                        settings: SamplingSettings) -> list[Generation]:
        batch = len(requests)
        assert all(r.prompt_ids for r in requests), "every request needs at least one prompt token"
        width = max(len(r.prompt_ids) for r in requests)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, request in enumerate(requests):
            input_ids[row, width - len(request.prompt_ids):] = torch.tensor(request.prompt_ids)
            attention[row, width - len(request.prompt_ids):] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        stop_tail = max((len(s) for s in settings.stop), default=0) + 2

        generated: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finish = ["length"] * batch
        live = list(range(batch))  # request rows still generating, in cache order
        cache = _new_cache(self.model)
        out = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device),
                         position_ids=positions.to(self.device), use_cache=True, logits_to_keep=1,
                         **{self._cache_kw: cache})
        next_pos = positions[:, -1] + 1
        for step in range(settings.max_new_tokens):
            logits = out.logits[:, -1, :].float().cpu()
            tokens, token_logprobs = self._pick(logits, [requests[r] for r in live],
                                                [generated[r] for r in live], [generators[r] for r in live],
                                                settings)
            keep = []
            for slot, row in enumerate(live):
                token = tokens[slot]
                generated[row].append(token)
                logprobs[row].append(token_logprobs[slot])
                reason = self._finished(generated[row], requests[row], settings, stop_tail)
                if reason:
                    finish[row] = reason
                else:
                    keep.append(slot)
            if not keep or step == settings.max_new_tokens - 1:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep)
                cache.batch_select_indices(index.to(self.device))
                attention, next_pos = attention[index], next_pos[index]
                tokens = [tokens[s] for s in keep]
                live = [live[s] for s in keep]
            attention = torch.cat([attention, torch.ones((len(live), 1), dtype=torch.long)], dim=1)
            out = self.model(input_ids=torch.tensor(tokens).view(-1, 1).to(self.device),
                             attention_mask=attention.to(self.device),
                             position_ids=next_pos.view(-1, 1).to(self.device), use_cache=True,
                             **{self._cache_kw: cache})
            next_pos = next_pos + 1
        return [Generation(token_ids=generated[row], logprobs=logprobs[row], finish_reason=finish[row],
                           text=self._tokenizer.decode(generated[row], skip_special_tokens=False))
                for row in range(batch)]

    def _pick(self, logits: torch.Tensor, requests: list[GenerationRequest], generated: list[list[int]],
              generators: list[torch.Generator], settings: SamplingSettings) -> tuple[list[int], list[float]]:
        """Choose one token per row; return the tokens and their recorded log-probs."""
        temperature = 1.0 if settings.greedy else settings.temperature
        assert temperature > 0, "temperature must be positive; use greedy=True for argmax decoding"
        recorded = torch.log_softmax(logits / temperature, dim=-1)
        scores = recorded.clone()
        for slot, request in enumerate(requests):
            if request.constraint is None:
                continue
            mask = request.constraint.allowed(generated[slot])
            if mask is not None:
                scores[slot] = scores[slot].masked_fill(~_fit_mask(mask, scores.shape[-1]), float("-inf"))
        if not settings.greedy:
            if settings.top_p < 1.0:
                scores = _top_p(scores, settings.top_p)
            # Gumbel-max with each row's own noise: the pick moves only if two perturbed scores tie within
            # float error, so batch-dependent rounding almost never changes a sample (an inverse-CDF draw over
            # 50k near-equal probabilities would flip often).
            noise = torch.empty_like(scores)
            for slot, generator in enumerate(generators):
                torch.rand(scores.shape[-1], generator=generator, out=noise[slot])
            scores = scores - torch.log(-torch.log(noise.clamp_(min=1e-20, max=1 - 1e-7)))
        tokens = scores.argmax(dim=-1)
        chosen = recorded.gather(1, tokens.view(-1, 1)).view(-1)
        return tokens.tolist(), chosen.tolist()

    def _finished(self, generated: list[int], request: GenerationRequest, settings: SamplingSettings,
                  stop_tail: int) -> str | None:
        if generated[-1] in self.eos_ids:
            return "stop"
        if settings.stop:
            tail = self._tokenizer.decode(generated[-stop_tail:], skip_special_tokens=False)
            if any(stop in tail for stop in settings.stop):
                return "stop"
        if request.constraint is not None and request.constraint.is_complete(generated):
            return "constraint"
        return None


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs with -inf outside each row's smallest top set whose mass reaches top_p (the top token stays)."""
    sorted_scores, sorted_idx = scores.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_scores, dim=-1)
    outside = (probs.cumsum(dim=-1) - probs) > top_p
    return scores.scatter(-1, sorted_idx, sorted_scores.masked_fill(outside, float("-inf")))


def _fit_mask(mask, vocab: int) -> torch.Tensor:
    """A constraint's mask sized to the model's logits (embedding matrices are often padded)."""
    mask = torch.as_tensor(mask, dtype=torch.bool).cpu()
    if mask.shape[-1] < vocab:
        mask = torch.cat([mask, torch.zeros(vocab - mask.shape[-1], dtype=torch.bool)])
    return mask[:vocab]


def _eos_ids(model, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    return {i for i in ids if i is not None}


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()
